"""The terminal's console: as wide as the terminal, or, when the output is piped, as wide as each
table's content needs, so that no number is cut at an 80-column default."""

from __future__ import annotations

import sys

from rich.console import Console

PIPED_WIDTH = 10_000  # wide enough that no table is cut; each is still sized to its content


def terminal_console(width: int | None = None) -> Console:
    return Console(width=width or (None if sys.stdout.isatty() else PIPED_WIDTH))

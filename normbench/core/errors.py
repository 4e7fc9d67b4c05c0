"""User-facing errors: one exception type the CLI turns into a short message and a non-zero exit."""

from __future__ import annotations

import importlib.util


class ConfigError(ValueError):
    """Bad input from the user: what is wrong, and what would be allowed instead."""

    def __init__(self, message: str, allowed=None):
        self.allowed = list(allowed) if allowed is not None else None
        text = message if self.allowed is None else f"{message}; allowed: {', '.join(map(str, self.allowed))}"
        super().__init__(text)


def first_line(err: BaseException, limit: int = 300) -> str:
    """An exception as one line for a terminal or a summary: its type and the first line of its message."""
    text = (str(err).strip().splitlines() or [""])[0]
    text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def installed(module: str) -> bool:
    """Whether an optional package (a launcher plugin, a tracker) can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


class DiskFull(Exception):
    """No space left on the device (or over quota) writing a run's files: the run stops where it is,
    resumable from its last checkpoint, and the user gets one line saying so."""

    def __init__(self, path, resume_step: int | None = None):
        self.path, self.resume_step = path, resume_step
        super().__init__(f"no space left on device writing {path}")

    def advice(self) -> str:
        where = f"from step {self.resume_step}" if self.resume_step else "from the start"
        return f"{self}; free space and run the same command again to resume {where}"

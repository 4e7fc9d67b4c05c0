"""User-facing errors: one exception type the CLI turns into a short message and a non-zero exit."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad input from the user: what is wrong, and what would be allowed instead."""

    def __init__(self, message: str, allowed=None):
        self.allowed = list(allowed) if allowed is not None else None
        text = message if self.allowed is None else f"{message}; allowed: {', '.join(map(str, self.allowed))}"
        super().__init__(text)

"""User-facing errors: one exception type, said in one line with exit code 2 at the edge of each of
normbench's processes (``edge``), and the helpers that word them."""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import importlib.util
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# What the ConfigErrors made inside ``about`` blocks are about, outermost first.
_SUBJECTS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("subjects", default=())


class ConfigError(ValueError):
    """Bad input from the user: what is wrong, and what would be allowed instead; inside ``about``
    blocks, said of their subjects."""

    def __init__(self, message: str, allowed=None):
        self.allowed = list(allowed) if allowed is not None else None
        text = message if self.allowed is None else f"{message}; allowed: {', '.join(map(str, self.allowed))}"
        super().__init__(": ".join([*_SUBJECTS.get(), text]))


@contextlib.contextmanager
def about(subject: str):
    """ConfigErrors made inside are said of ``subject`` (a file and its field, a key and its value):
    ``SUBJECT: its message``, still one line. The error carries its subject from the start, so that
    nothing between the mistake and the edge has to catch it to add one."""
    token = _SUBJECTS.set((*_SUBJECTS.get(), subject))
    try:
        yield
    finally:
        _SUBJECTS.reset(token)


def edge(run: Callable[[], T], say: Callable[[str], None]) -> T:
    """``run()``, where a user's mistake ends the process: the one handler of a ConfigError, at the
    edge of the command line (``normbench.cli``) and of a sweep's Hydra process
    (``normbench.sweeps.multirun``). ``say`` gets its one line; the exit code is 2, with no traceback."""
    try:
        return run()
    except ConfigError as err:
        say(str(err))
        raise SystemExit(2) from None


def first_line(err: BaseException, limit: int = 300, named: bool = True) -> str:
    """An exception as one line for a terminal or a summary: its type and the first line of its message
    (the message's line alone when not ``named``, to follow what a sentence already says it is about)."""
    text = (str(err).strip().splitlines() or [""])[0]
    if named or not text:
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


def did_you_mean(word: str, choices, shown=lambda choice: choice) -> str:
    """``"; did you mean X?"`` for the choice closest to a mistyped ``word`` (difflib), or ``""``."""
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {shown(close[0])}?" if close else ""


def unknown_option(group: str, option: str, options) -> str:
    choices = ", ".join(map(str, options))
    return f"unknown {group} '{option}'{did_you_mean(option, options)} (choices: {choices})"


def unknown_key(full_key: str, siblings) -> str:
    """``full_key`` is not in its parent, whose keys are ``siblings``."""
    parent, _, key = full_key.rpartition(".")
    hint = did_you_mean(key, siblings, lambda k: f"{parent}.{k}" if parent else k)
    return f"unknown key {full_key}{hint or '; normbench train --cfg job shows every key'}"


def composition_error(err: Exception) -> str:
    """One of Hydra's composition errors on one line a user can act on: an unknown config option
    (``norm=rsm``) with its group's choices, an unknown key (``train.step=5``) with the closest key,
    never Hydra's search path nor its advice to add the key with ``+`` (which the typed config then
    refuses); a grid given to a command that runs one configuration points to ``normbench sweep``."""
    from hydra.errors import MissingConfigException  # imported here: this module stays light
    from omegaconf import DictConfig
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    if isinstance(err, MissingConfigException) and err.options and "/" in (err.missing_cfg_file or ""):
        group, _, option = err.missing_cfg_file.rpartition("/")
        return unknown_option(group, option, err.options)
    missing = (ConfigKeyError, ConfigAttributeError)
    key_error = err if isinstance(err, missing) else err.__cause__
    if isinstance(key_error, missing) and isinstance(key_error.parent_node, DictConfig):
        return unknown_key(str(key_error.full_key), list(key_error.parent_node.keys()))
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if lines and lines[0].startswith("Ambiguous value for argument"):
        grid = lines[0].removeprefix("Ambiguous value for argument").strip()
        return f"{grid} is a list of values, and this command runs one configuration: use normbench sweep"
    return " ".join(lines[:2])

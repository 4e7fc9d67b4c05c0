"""Files that a crash, a kill or a full disk never leaves half-written, and the JSON normbench writes.

The lowest layer of the package: it imports nothing of normbench but its errors, so every other
module (training, benchmarks, the report) may use it without pulling in the rest.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import tempfile
from pathlib import Path

from normbench.core.errors import DiskFull

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


@contextlib.contextmanager
def disk_full_is(path: Path):
    """Turn "no space left on device" (or over quota) while writing ``path`` into DiskFull: one line for the
    user."""
    try:
        yield
    except OSError as err:
        if err.errno in NO_SPACE:
            raise DiskFull(path) from None
        raise


def as_umask_allows(mode: int) -> int:
    """``mode`` less the user's umask: what open() and mkdir() would give. mkstemp and mkdtemp create
    0600 and 0700, and results are meant to be read by colleagues on shared storage."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write a file so readers see the old content or the new one, never half of it."""
    with atomic_file(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


@contextlib.contextmanager
def atomic_file(path: Path, before_replace=None):
    """A binary file to write ``path`` through: a temporary file beside it, synced to disk and renamed
    onto ``path`` only once the block ends without error, so ``path`` is the old content or the new,
    never half of it (a kill leaves a hidden .tmp, never a torn ``path``). ``before_replace()`` runs
    between the sync and the rename (to move the file it replaces aside)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with disk_full_is(path), os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, as_umask_allows(0o666))
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def finite_or_none(value):
    """JSON has no NaN or infinity: a diverged loss is recorded as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def to_json(record: dict, **kwargs) -> str:
    return json.dumps(finite_or_none(record), allow_nan=False, **kwargs)


def read_jsonl(path: Path, on_torn_tail=None) -> list[dict]:
    """Every record of a JSONL log. A torn last line (a kill mid-write) is dropped, and
    reported to ``on_torn_tail(message)``; a bad line before the last means a corrupt file (ValueError)."""
    lines = [
        line
        for line in Path(path).read_bytes().decode("utf-8", errors="replace").splitlines()
        if line.strip()
    ]
    records = []
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError:
            if i < len(lines) - 1:
                raise ValueError(f"line {i + 1} of {Path(path).name} is not JSON") from None
            if on_torn_tail:
                on_torn_tail(f"{path}: ignored a truncated last line")
            break
        if isinstance(record, dict):
            records.append(record)
    return records


def leaves(tree, prefix: str = "", lists: str = "index") -> dict:
    """A nested record as its leaves: {"layers": [{"g": 1.0}]} -> {"layers.0.g": 1.0}.

    ``lists="json"`` keeps a list whole, as a JSON string (a value a table can group on).
    """
    out = {}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, (list, tuple)) and lists == "json":
            out[name] = json.dumps(value, default=str)
        elif isinstance(value, (dict, list, tuple)):
            out.update(leaves(value, f"{name}.", lists))
        else:
            out[name] = value
    return out

"""Run storage: one directory per run, written so that a crash or a kill never corrupts it.

    config.yaml     the resolved config (written before training starts)
    metrics.jsonl   one JSON object per line, appended and flushed as training goes
    summary.json    written once at the end, atomically (temp file + rename)
    error.log       the traceback of a run that failed

A run directory is complete exactly when summary.json exists.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CONFIG, METRICS, SUMMARY, ERROR_LOG = "config.yaml", "metrics.jsonl", "summary.json", "error.log"


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write a file so readers see the old content or the new one, never half of it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600; results are meant to be read by colleagues on shared storage.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _finite_or_none(value):
    """JSON has no NaN or infinity: a diverged loss is recorded as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def to_json(record: dict) -> str:
    return json.dumps(_finite_or_none(record), allow_nan=False)


def read_jsonl(path: Path, on_torn_tail=None) -> list[dict]:
    """Every record of a JSONL log. A torn last line (a kill mid-write) is dropped, and
    reported to ``on_torn_tail(message)``; a bad line before the last means a corrupt file (ValueError)."""
    lines = [line for line in Path(path).read_bytes().decode("utf-8", errors="replace").splitlines() if line.strip()]
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


class RunDir:
    def __init__(self, path: Path | str):
        self.path = Path(path)

    def write_config(self, cfg: DictConfig) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path / CONFIG, OmegaConf.to_yaml(cfg, resolve=True))

    def write_summary(self, summary: dict) -> None:
        write_atomic(self.path / SUMMARY, json.dumps(_finite_or_none(summary), indent=2, allow_nan=False) + "\n")

    def read_summary(self) -> dict | None:
        """The summary, or None when there is none yet (running, killed) or it is unreadable."""
        try:
            return json.loads((self.path / SUMMARY).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def read_metrics(self) -> list[dict]:
        return read_jsonl(self.path / METRICS)

    def write_error(self, text: str) -> None:
        write_atomic(self.path / ERROR_LOG, text)

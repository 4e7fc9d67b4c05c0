"""Metric sinks: where the training loop's records go.

The JSONL file in the run directory is the source of truth and is always written;
``logger=NAME`` adds a mirror (``logger=tensorboard``: TensorBoard event files in the
run directory, one scalar per JSONL key, nested keys joined with dots).
"""

from __future__ import annotations

import os
from pathlib import Path

from normbench.errors import ConfigError
from normbench.runs import METRICS, to_json


class JsonlSink:
    """Appends one JSON object per line and flushes, so a crash keeps everything logged so far.

    A resumed run first cuts the file back to its length at the checkpoint (``offset``),
    so no record appears twice.
    """

    def __init__(self, run_dir: Path, offset: int | None = None):
        path = Path(run_dir) / METRICS
        if offset is not None:
            os.truncate(path, offset)
        self.file = open(path, "w" if offset is None else "a", encoding="utf-8")

    def position(self) -> int:
        """The file's length, on disk: what a checkpoint records."""
        self.file.flush()
        os.fsync(self.file.fileno())
        return self.file.tell()

    def log(self, record: dict) -> None:
        self.file.write(to_json(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def flatten(record: dict, prefix: str = "") -> dict[str, float]:
    """{"layers": [{"grad_norm": {"mlp_out": 1.0}}]} -> {"layers.0.grad_norm.mlp_out": 1.0}."""
    out = {}
    items = record.items() if isinstance(record, dict) else enumerate(record)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, (dict, list)):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and name != "step":
            out[name] = float(value)
    return out


class TensorBoardSink:
    def __init__(self, run_dir: Path, purge_step: int | None = None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("logger=tensorboard needs the tensorboard package: pip install 'normbench[tensorboard]'") from None
        # A resumed run hides the events logged after its checkpoint (they are logged again).
        self.writer = SummaryWriter(log_dir=str(run_dir), purge_step=purge_step)

    def log(self, record: dict) -> None:
        for name, value in flatten(record).items():
            self.writer.add_scalar(name, value, global_step=record["step"])

    def close(self) -> None:
        self.writer.close()


EXTRA_SINKS = {"jsonl": [], "tensorboard": [TensorBoardSink]}


class MetricSinks:
    """Fans each record out to the JSONL file and the configured mirrors."""

    def __init__(self, run_dir: Path, logger: str = "jsonl", enabled: bool = True, resume_at: tuple[int, int] | None = None):
        """``resume_at``: (metrics.jsonl's length, step) at the checkpoint a resumed run continues from."""
        if logger not in EXTRA_SINKS:
            raise ConfigError(f"unknown logger '{logger}'", allowed=sorted(EXTRA_SINKS))
        offset, step = resume_at or (None, None)
        # Disabled on data-parallel ranks other than 0: one writer per run directory.
        self.sinks = [JsonlSink(run_dir, offset),
                      *(cls(run_dir, None if step is None else step + 1) for cls in EXTRA_SINKS[logger])] if enabled else []

    def position(self) -> int | None:
        """metrics.jsonl's length, flushed to disk; None where this process writes no metrics."""
        return self.sinks[0].position() if self.sinks else None

    def log(self, record: dict) -> None:
        for sink in self.sinks:
            sink.log(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

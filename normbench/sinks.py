"""Metric sinks: where the training loop's records go.

The JSONL file in the run directory is the source of truth and is always written;
``logger=NAME`` adds a mirror (``logger=tensorboard``: TensorBoard event files in the
run directory, one scalar per JSONL key, nested keys joined with dots).
"""

from __future__ import annotations

from pathlib import Path

from normbench.errors import ConfigError
from normbench.runs import METRICS, to_json


class JsonlSink:
    """Appends one JSON object per line and flushes, so a crash keeps everything logged so far."""

    def __init__(self, run_dir: Path):
        self.file = open(Path(run_dir) / METRICS, "w", encoding="utf-8")

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
    def __init__(self, run_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("logger=tensorboard needs the tensorboard package: pip install 'normbench[tensorboard]'") from None
        self.writer = SummaryWriter(log_dir=str(run_dir))

    def log(self, record: dict) -> None:
        for name, value in flatten(record).items():
            self.writer.add_scalar(name, value, global_step=record["step"])

    def close(self) -> None:
        self.writer.close()


EXTRA_SINKS = {"jsonl": [], "tensorboard": [TensorBoardSink]}


class MetricSinks:
    """Fans each record out to the JSONL file and the configured mirrors."""

    def __init__(self, run_dir: Path, logger: str = "jsonl", enabled: bool = True):
        if logger not in EXTRA_SINKS:
            raise ConfigError(f"unknown logger '{logger}'", allowed=sorted(EXTRA_SINKS))
        # Disabled on data-parallel ranks other than 0: one writer per run directory.
        self.sinks = [JsonlSink(run_dir), *(cls(run_dir) for cls in EXTRA_SINKS[logger])] if enabled else []

    def log(self, record: dict) -> None:
        for sink in self.sinks:
            sink.log(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

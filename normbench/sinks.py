"""Metric sinks: where the training loop's records go.

The JSONL file in the run directory is the source of truth and is always written;
other sinks (TensorBoard) mirror it. A sink takes one flat-ish dict per call.
"""

from __future__ import annotations

from pathlib import Path

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


class MetricSinks:
    """Fans each record out to every configured sink."""

    def __init__(self, sinks: list):
        self.sinks = sinks

    def log(self, record: dict) -> None:
        for sink in self.sinks:
            sink.log(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

"""The metrics a report ranks, tunes and compares by: one table of name -> label, unit, direction.

``--metric`` picks one; it drives the whole verdict (the ranking, each configuration's best value
of the tuned key, the seed statistics, "vs best", the LR sensitivity), and its label and unit head
every sentence, table column and chart axis that shows it. A metric where higher is better
(throughput, MFU) has its best at the maximum, and "worse" means a negative difference.

With a bits-per-byte metric the report converts every loss of every run (final, best, at init, the
curves) to bits per byte in place (normbench.report.load.in_bits_per_byte): the metric then reads
the converted loss column, and every loss the report shows is in bits per byte.
"""

from __future__ import annotations

from dataclasses import dataclass

NATS, BITS = "nats/token", "bits/byte"


@dataclass(frozen=True)
class Metric:
    name: str
    label: str  # in sentences: "final validation loss"
    header: str  # in table headers and on chart axes: "final val loss"
    unit: str
    higher_is_better: bool = False
    column: str = ""  # the summary.csv column holding its value (default: its name)
    loss: bool = False  # a loss has a value at init, the LR sensitivity's ceiling
    fmt: str = ".3f"

    @property
    def source(self) -> str:
        return self.column or self.name

    @property
    def best_word(self) -> str:
        return "highest" if self.higher_is_better else "lowest"

    def axis(self) -> str:
        """'final val loss (bits/byte)': a column header or an axis label."""
        return f"{self.header} ({self.unit})" if self.unit and self.unit != self.header else self.header

    def value(self, value: float) -> str:
        """'2.909 bits/byte', '12,345 tokens/s'."""
        return f"{value:{self.fmt}}" + (f" {self.unit}" if self.unit else "")

    def diff(self, value: float) -> str:
        return f"{value:+{self.fmt}}"


_TABLE = (
    Metric("final_val_loss", "final validation loss", "final val loss", NATS, loss=True),
    Metric("best_val_loss", "best validation loss", "best val loss", NATS, loss=True),
    Metric("floor_gap", "gap to the loss floor", "gap to floor", NATS, loss=True),
    Metric(
        "final_val_bpb", "final validation loss", "final val loss", BITS, column="final_val_loss", loss=True
    ),
    Metric("best_val_bpb", "best validation loss", "best val loss", BITS, column="best_val_loss", loss=True),
    Metric("tokens_per_s", "throughput", "tokens/s", "tokens/s", higher_is_better=True, fmt=",.0f"),
    Metric("step_ms_p50", "median step time", "step ms (p50)", "ms", fmt=".1f"),
    Metric("step_ms_p90", "90th-percentile step time", "step ms (p90)", "ms", fmt=".1f"),
    Metric("peak_mem_mb", "peak memory", "peak MB", "MB", fmt=",.0f"),
    Metric("mfu", "model FLOPs utilisation", "MFU", "", higher_is_better=True),
    Metric("wall_s", "wall time", "wall s", "s", fmt=".1f"),
    Metric("max_grad_norm", "largest gradient norm", "max grad norm", "", fmt=".3g"),
    Metric(
        "max_grad_spike", "largest gradient spike (x its running median)", "max grad spike", "", fmt=".3g"
    ),
    Metric("clip_fraction", "fraction of steps clipped", "clip fraction", ""),
)
METRICS: dict[str, Metric] = {m.name: m for m in _TABLE}
BITS_PER_BYTE = tuple(m.name for m in _TABLE if m.unit == BITS)
HIGHER_IS_BETTER = {m.name for m in _TABLE if m.higher_is_better}
DEFAULT = "final_val_loss"


def metric(name: str) -> Metric:
    return METRICS[name]


def loss_unit(name: str) -> str:
    """The unit every loss of a report is shown in under ``--metric name``."""
    return BITS if name in BITS_PER_BYTE else NATS

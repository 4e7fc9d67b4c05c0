"""The norm benchmark's goals, stated once for ``normbench bench`` and for the report.

RMSNorm, ScaleNorm, DyT, Derf and per-token GroupNorm read and write no more memory than
LayerNorm (each is one pass of elementwise work over the same bytes), so an implementation of
theirs slower than LayerNorm's native op by more than ``LIMIT`` measures the code, not the norm;
LayerNorm and BatchNorm are held to ``LIMIT`` of their own native op. The bench
checks its measurements against ``GOALS``; the report, which imports no torch and so not the
bench, reads bench CSVs against the same numbers.
"""

from __future__ import annotations

LIMIT = 1.1  # at most 1.1x the reference's time
NO_SLOWER_THAN_LN = ("rms", "gn", "scale", "dyt", "derf")  # norms that move no more bytes than LayerNorm
# norm: (the reference its ratio is taken to, the most that ratio may be)
GOALS = {
    "ln": ("native", LIMIT),
    "bn": ("native", LIMIT),
    **{norm: ("ln", LIMIT) for norm in NO_SLOWER_THAN_LN},
}

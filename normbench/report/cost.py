"""Implementation cost: whether a bench CSV shows a norm's implementation at the cost its math allows.

The norms that move no more bytes than LayerNorm, and how close to its native op they must run
(``LIMIT``), come from normbench.bench.goals, shared with ``normbench bench``: an
implementation slower than that measures the code, not the norm. The bench chart,
the throughput chart and the verdict all carry the one sentence built here, so a throughput
difference is never read as a property of the norm without it.
"""

from __future__ import annotations

import pandas as pd

from normbench.bench.goals import LIMIT, NO_SLOWER_THAN_LN

BENCH_HINT = (
    "run `normbench bench --out bench.csv` on the training machine, then `normbench report RUNS bench.csv`"
)


def slow_implementations(bench: pd.DataFrame | None, norms=None) -> pd.DataFrame:
    """Per device and norm, normbench's worst row with ratio_to_ln > LIMIT (norms: restrict to these)."""
    columns = ["device", "norm", "ratio_to_ln", "dim", "dtype", "pass"]
    if bench is None or "ratio_to_ln" not in bench:
        return pd.DataFrame(columns=columns)
    rows = bench[
        bench["norm"].isin(NO_SLOWER_THAN_LN)
        & bench["impl"].eq("normbench")
        & (pd.to_numeric(bench["ratio_to_ln"], errors="coerce") > LIMIT)
    ]
    if norms is not None:
        rows = rows[rows["norm"].isin(list(norms))]
    worst = rows.sort_values("ratio_to_ln", ascending=False, kind="stable").drop_duplicates(
        ["device", "norm"]
    )
    return worst.sort_values(["device", "norm"], kind="stable")[columns].reset_index(drop=True)


def implementation_note(bench: pd.DataFrame | None, norms=None) -> str:
    """The caveat for any comparison of norms' speed: which implementations are not at their limit
    (or that the bench finds none, or that there is no bench to say). ``norms``: the norms compared."""
    if bench is None or bench.empty:
        return (
            "The norms' implementation cost on this device is unknown (no bench CSV among the inputs): "
            f"{BENCH_HINT}."
        )
    slow = slow_implementations(bench, norms)
    if slow.empty:
        measured = bench[bench["norm"].isin(NO_SLOWER_THAN_LN) & bench["impl"].eq("normbench")]
        if norms is not None:
            measured = measured[measured["norm"].isin(list(norms))]
        if "ratio_to_ln" in measured and measured["ratio_to_ln"].notna().any():
            names = ", ".join(dict.fromkeys(measured["norm"]))
            return (
                f"Implementations at their limit in the bench: {names} within {LIMIT}x LayerNorm's native op."
            )
        return ""
    parts = []
    for device, rows in slow.groupby("device", sort=False):
        items = "; ".join(
            f"{norm} ({ratio:.2f}x LayerNorm at {dim} {dtype} {pass_})"
            for norm, ratio, dim, dtype, pass_ in zip(
                rows["norm"], rows["ratio_to_ln"], rows["dim"], rows["dtype"], rows["pass"]
            )
        )
        parts.append(f"implementations not at their limit on {device}: {items}")
    text = ". ".join(parts)
    return (
        text[0].upper()
        + text[1:]
        + " — throughput differences there measure the implementation, not the norm."
    )

"""Tables: which runs form a configuration, and the per-configuration table.

Group keys (default: the config keys that vary between runs), the configuration labels, the
aggregate (aggregate.csv: counts, loss mean/std/CI over completed seeds, speed), and its one
string formatting shared by the terminal, summary.md and report.html; the scale axis's scale.csv
and trend.csv in the same short strings (``scale_tables``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from normbench.core.errors import ConfigError
from normbench.core.identity import NOT_HASHED
from normbench.report.load import (
    ALIASES,
    LOGIT_FIELDS,
    LOSS_FIELDS,
    SPEED_FIELDS,
    ReportData,
)
from normbench.report.metrics import DEFAULT, loss_unit, metric
from normbench.report.stats import NEEDS_SEEDS

# The model keys a placement's own recipe sets (conf/placement/*.yaml: init, tie_head)
PLACEMENT_RECIPE = ("model.init", "model.tie_head")
# The display names of LOGIT_FIELDS' columns (the mean over runs of each run's peak).
LOGIT_COLUMNS = ("max attn logit", "max log Z", "max attn logit (raw)", "max log Z (raw)")


def _is_bookkeeping(key: str) -> bool:
    """Config keys that vary between runs without defining a configuration: seeds, paths, the
    keys the config hash ignores because they never change a result (train.threads, train.progress),
    and train.batched: seeds trained as one batched model compute the same configuration (a sweep
    with --batch-seeds trains what cannot be batched one run at a time)."""
    last = key.rsplit(".", 1)[-1]
    return (
        key.startswith("hydra.")
        or key in NOT_HASHED
        or key == "train.batched"
        or last == "seed"
        or last in ("out", "output")
        or last.endswith(("dir", "path", "file"))
    )


def varying_keys(runs: pd.DataFrame, config_keys: list[str]) -> list[str]:
    """The config keys whose value differs between runs (bookkeeping left out), norm and placement first."""
    varying = [
        ALIASES.get(k, k) for k in config_keys if not _is_bookkeeping(k) and runs[k].nunique(dropna=False) > 1
    ]
    return [k for k in ("norm", "placement") if k in varying] + [
        k for k in varying if k not in ("norm", "placement")
    ]


def default_group_keys(runs: pd.DataFrame, config_keys: list[str]) -> list[str]:
    """The config keys that actually vary across runs, norm and placement first."""
    keys = varying_keys(runs, config_keys)
    # norm.eps, placement.final_norm, ... that merely follow the norm/placement name split no
    # group further; keeping them would only clutter every label. So with the model's init and head where
    # they follow the placement (each under its own recipe): pre and post are two configurations, not four.
    for short in ("norm", "placement"):
        if short in keys:
            keys = [
                k
                for k in keys
                if not (
                    (k.startswith(short + ".") or (short == "placement" and k in PLACEMENT_RECIPE))
                    and runs.groupby(short, dropna=False)[k].nunique(dropna=False).max() <= 1
                )
            ]
    return keys or ["norm", "placement"]


def ran(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that did not fail (all of them when every one did). A run that failed (a config that
    does not validate, a crash while building) is counted in its configuration, never the reason for
    one: the default group keys, tuning key and size axis are the keys that vary among these."""
    kept = runs[~runs["status"].eq("failed")]
    return kept if len(kept) else runs


def resolve_group_keys(group_by: list[str] | None, data: ReportData) -> list[str]:
    if not group_by:
        return default_group_keys(ran(data.runs), data.config_keys)
    allowed = ["norm", "placement", *[k for k in data.config_keys if k not in ALIASES]]
    keys = []
    for key in group_by:
        key = ALIASES.get(key.strip(), key.strip())
        if key not in allowed:
            raise ConfigError(f"unknown group key {key!r}", allowed=allowed)
        keys += [key] if key not in keys else []
    return keys


def _fmt_value(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))  # a column with a missing value turns ints into floats
    return str(value)


def config_label(keys: list[str], values) -> str:
    """'ln/pre lr=0.003' for the group keys of one configuration."""
    values = dict(zip(keys, values))
    head = "/".join(_fmt_value(values[k]) for k in ("norm", "placement") if k in values)
    short = [k.rsplit(".", 1)[-1] for k in keys]
    rest = [
        f"{s if short.count(s) == 1 else k}={_fmt_value(values[k])}"
        for k, s in zip(keys, short)
        if k not in ("norm", "placement")
    ]
    return " ".join([head] * bool(head) + rest)


def aggregate(
    runs: pd.DataFrame, keys: list[str], metric_name: str = DEFAULT, size_key: str | None = None
) -> pd.DataFrame:
    """One row per configuration (the group keys), best first by the metric (within each size of
    ``size_key``, the scale axis, smallest size first: configurations are only ranked within a size).

    Loss mean/std/count use completed runs only (std is the sample std, ddof=1); diverged and
    failed runs are counted separately, and so are the completed runs that did not learn
    (normbench.report.load.did_not_learn). Throughput and memory average every run that reported
    them: a diverged run's speed is still a real measurement; except the report's metric, which,
    like every statistic of the verdict, uses completed runs only.
    """
    m = metric(metric_name)
    status = runs["status"]
    flags = runs.assign(
        runs=1,
        completed=status.eq("completed"),
        diverged=status.eq("diverged"),
        failed=status.eq("failed"),
        did_not_learn=runs["did_not_learn"].fillna(False).astype(bool) if "did_not_learn" in runs else False,
        leaks_future=runs["leaks_future"].map(
            lambda v: bool(v) if isinstance(v, (bool, np.bool_)) else pd.NA
        ),
    )
    groups = flags.groupby(keys, dropna=False, sort=False)
    agg = groups[["runs", "completed", "diverged", "failed", "did_not_learn"]].sum()
    completed = runs[status.eq("completed")].groupby(keys, dropna=False, sort=False)
    ranked = list(dict.fromkeys((*LOSS_FIELDS, m.source)))
    losses = completed[ranked].agg(["mean", "std", "count"])
    losses.columns = [f"{field}_{stat}" for field, stat in losses.columns]
    speed_fields = [f for f in SPEED_FIELDS if f not in ranked]
    agg = agg.join(losses).join(groups[speed_fields].mean().add_suffix("_mean"))
    # The logit peaks (max over the statistics steps): like speed, every run that logged them counts;
    # a diverged run's peak before it diverged is what shows the instability.
    logit_fields = [f for f in LOGIT_FIELDS if f in runs and runs[f].notna().any()]
    if logit_fields:
        agg = agg.join(groups[logit_fields].mean().add_suffix("_mean"))
    agg["leaks_future"] = groups["leaks_future"].agg(
        lambda s: bool(s.dropna().any()) if s.notna().any() else pd.NA
    )
    for col in [c for c in agg.columns if c.endswith("_count")]:
        agg[col] = agg[col].fillna(0).astype(int)  # a group whose runs all diverged has no completed losses
    agg = agg.reset_index()
    by, ascending = [f"{m.source}_mean"], [not m.higher_is_better]
    if size_key:
        by, ascending = [size_key, *by], [True, *ascending]
    agg = agg.sort_values(by, ascending=ascending, na_position="last", kind="stable")
    agg.insert(0, "config", [config_label(keys, v) for v in agg[keys].itertuples(index=False)])
    return agg.reset_index(drop=True)


def display_table(agg: pd.DataFrame, keys: list[str], metric_name: str) -> pd.DataFrame:
    """The aggregate as short strings: one formatting for the terminal, Markdown and HTML.

    Every loss column is headed with the report's loss unit; the interval and "vs best" columns
    follow the report's metric's own column (the final loss unless --metric says otherwise)."""
    m, unit = metric(metric_name), loss_unit(metric_name)

    def pm(row, field, spec=".3f"):
        mean, std, n = row[f"{field}_mean"], row[f"{field}_std"], row[f"{field}_count"]
        if pd.isna(mean):
            return "–"
        return f"{mean:{spec}}" + (f" ± {std:{spec}}" if n > 1 else "") + f" (n={n})"

    def num(value, spec):
        return "–" if pd.isna(value) else format(value, spec)

    columns = {
        ("final_val_loss", f"final val loss ({unit})"): [pm(r, "final_val_loss") for _, r in agg.iterrows()],
        ("best_val_loss", f"best val loss ({unit})"): [pm(r, "best_val_loss") for _, r in agg.iterrows()],
        ("floor_gap", f"gap to floor ({unit})"): agg["floor_gap_mean"].map(lambda v: num(v, ".3f")),
        ("tokens_per_s", "tokens/s"): agg["tokens_per_s_mean"].map(lambda v: num(v, ",.0f")),
        ("step_ms_p50", "step ms (p50)"): agg["step_ms_p50_mean"].map(lambda v: num(v, ".1f")),
        ("peak_mem_mb", "peak MB"): agg["peak_mem_mb_mean"].map(lambda v: num(v, ",.0f")),
    }
    if m.source not in {field for field, _ in columns}:
        columns[(m.source, m.axis())] = [pm(r, m.source, m.fmt) for _, r in agg.iterrows()]
    elif m.source in SPEED_FIELDS:  # the report's metric: over completed runs, with its spread
        columns = {
            k: ([pm(r, m.source, m.fmt) for _, r in agg.iterrows()] if k[0] == m.source else v)
            for k, v in columns.items()
        }
    table = pd.DataFrame({k: agg[k].map(_fmt_value) for k in keys})
    table["runs"] = agg["runs"].astype(str)
    # the report's metric first, then its interval and its comparison with the best
    for field, name in sorted(columns, key=lambda c: c[0] != m.source):
        table[name] = list(columns[(field, name)])
        if field == m.source and "ci_low" in agg:
            table["95% CI"] = [fmt_ci(r) for _, r in agg.iterrows()]
            table["vs best"] = [fmt_vs_best(r) for _, r in agg.iterrows()]
    for field, name in zip(LOGIT_FIELDS, LOGIT_COLUMNS):
        if f"{field}_mean" in agg:
            # 3 significant digits, without the exponent a peak of 1,340 would get from ".3g"
            table[name] = agg[f"{field}_mean"].map(lambda v: num(v, ",.0f" if abs(v) >= 100 else ".3g"))
    table["diverged"] = agg["diverged"].astype(str)
    table["failed"] = agg["failed"].astype(str)
    table["did not learn"] = agg["did_not_learn"].astype(str)
    if agg["leaks_future"].notna().any():
        table["leaks future"] = agg["leaks_future"].map(
            lambda v: "–" if pd.isna(v) else ("yes" if v else "no")
        )
    return table


def fmt_ci(row, low="ci_low", high="ci_high", sign="") -> str:
    """'[2.480, 2.520]', or why there is no interval (needs ≥ 2 seeds, no completed run)."""
    if pd.isna(row.get(low)):
        return str(row.get("ci_method") if low == "ci_low" and pd.notna(row.get("ci_method")) else "–")
    return f"[{_bound(row[low], sign)}, {_bound(row[high], sign)}]"


def _bound(value: float, sign: str) -> str:
    """Three decimals, more where those would round a non-zero bound to 0: an interval
    printed as [+0.000, +0.035] would read as touching 0 when it excludes it."""
    decimals = 3
    while decimals < 6 and value != 0 and round(value, decimals) == 0:
        decimals += 1
    return f"{value:{sign}.{decimals}f}"


def fmt_vs_best(row) -> str:
    """'best', 'tied +0.002 [-0.004, +0.008]', 'worse +0.310 [+0.290, +0.330]', or why not compared."""
    verdict = row.get("vs_best")
    if pd.isna(verdict) or verdict in ("best", "no completed run"):
        return "–" if pd.isna(verdict) else str(verdict)
    if pd.isna(row.get("diff_ci_low")):
        return f"{row['diff_vs_best']:+.3f}, {verdict}"
    return f"{verdict} {row['diff_vs_best']:+.3f} {fmt_ci(row, 'diff_ci_low', 'diff_ci_high', '+')}"


def tuned_table(tuned: pd.DataFrame) -> pd.DataFrame:
    """tuned.csv as short strings, for the terminal, Markdown and HTML."""
    key, m = tuned["tune_key"].iloc[0], metric(tuned["metric"].iloc[0])

    def num(value, spec):
        return "–" if pd.isna(value) else format(value, spec)

    return pd.DataFrame(
        {
            "configuration": tuned["config"],
            f"best {key}": tuned["best_value"].map(lambda v: num(v, "g")),
            m.axis(): [
                f"{v:{m.fmt}} (n={n})" if pd.notna(v) else "–"
                for v, n in zip(tuned[f"{m.source}_mean"], tuned["n_seeds"])
            ],
            "95% CI": [fmt_ci(r) for _, r in tuned.iterrows()],
            "vs best": [fmt_vs_best(r) for _, r in tuned.iterrows()],
            "p": tuned["p_value"].map(
                lambda v: "–" if pd.isna(v) else ("<0.001" if v < 1e-3 else f"{v:.3f}")
            ),
            "sensitivity": tuned["lr_sensitivity"].map(lambda v: num(v, ".3f")),
            "values ok/diverged/failed": [
                f"{c}/{dv}/{f} of {n}"
                for c, dv, f, n in zip(
                    tuned["values_completed"],
                    tuned["values_diverged"],
                    tuned["values_failed"],
                    tuned["values"],
                )
            ],
            "diverged at": tuned["diverged_at"].replace("", "–"),
        }
    )


def short_key(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def scale_tables(s) -> tuple[pd.DataFrame, pd.DataFrame]:
    """scale.csv and trend.csv of the scale axis ``s`` (normbench.report.scale.Scale, which reads this
    module) as short strings, for the terminal, Markdown and HTML."""
    t, key, m = s.table, s.key, metric(s.metric)

    def num(value, spec):
        return "–" if pd.isna(value) else format(value, spec)

    tune = t["tune_key"].iloc[0]
    per_size = pd.DataFrame(
        {
            "configuration": t["config"],
            short_key(key): t[key].map(_fmt_value),
            "params": t["params"].map(lambda v: num(v, ",.0f")),
            "tokens": t["tokens"].map(lambda v: num(v, ",.0f")),
            **(
                {f"best {tune}": t["best_value"].map(lambda v: num(v, "g"))}
                if isinstance(tune, str) and tune
                else {}
            ),
            m.axis(): [
                f"{v:{m.fmt}} (n={n})" if pd.notna(v) else "–"
                for v, n in zip(t[f"{m.source}_mean"], t["n_seeds"])
            ],
            "95% CI": [fmt_ci(r) for _, r in t.iterrows()],
            "vs best at size": t["vs_best"].fillna("–"),
            f"vs {s.baseline}": [
                (
                    "baseline"
                    if r["diff_method"] == "baseline"
                    else f"{r['diff_vs_baseline']:+.3f} "
                    + (
                        fmt_ci(r, "diff_ci_low", "diff_ci_high", "+")
                        if pd.notna(r["diff_ci_low"])
                        else NEEDS_SEEDS
                    )
                )
                if pd.notna(r["diff_vs_baseline"])
                else "–"
                for _, r in t.iterrows()
            ],
            "sensitivity": t["lr_sensitivity"].map(lambda v: num(v, ".3f")),
        }
    )
    tr = s.trend
    trend = pd.DataFrame(
        {
            "configuration": tr["config"],
            "slope per doubling": tr["slope_per_doubling"].map(lambda v: num(v, "+.4f")),
            "95% CI": [
                "–" if pd.isna(lo) else f"[{lo:+.4f}, {hi:+.4f}]"
                for lo, hi in zip(tr["slope_ci_low"], tr["slope_ci_high"])
            ],
            "sizes fitted": [f"{f} of {n}" for f, n in zip(tr["sizes_fitted"], tr["sizes"])],
            "trend": tr["trend"],
            "best-value drift (half-decades)": tr["best_drift_half_decades"].map(lambda v: num(v, "+.1f")),
        }
    )
    return per_size, trend

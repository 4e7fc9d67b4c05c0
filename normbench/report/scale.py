"""The scale axis: how each comparison moves with the model's size or its token budget.

``normbench report --scale KEY`` (or detected: exactly one of SIZE_KEYS varies). A *configuration*
is the group keys without the tuning key and without KEY; a *size* is one value of KEY. For
each configuration at each size (scale.csv):

- its tuned result as normbench.report.tuning finds it: the best value of the tuning key, the
  mean of the report's metric there with its 95% interval, the LR sensitivity, and the comparison with the
  best configuration of that size (the per-size verdict);
- its parameters (summary.json) and tokens (train.steps x train.batch_size x model.block_size);
- its difference to the baseline configuration at that size (paired by seed when both ran the
  same seeds, normbench.report.stats), with its interval, standard error and degrees of freedom.

Across sizes, per configuration (trend.csv): the difference against log2(x), x the size's
parameters (its tokens when KEY is a token budget or the parameters do not change; KEY's own
value when neither does), fitted by least squares, every size weighted alike, over the sizes
where both sides have ≥ 2 seeds (docs/reports.md#the-scale-axis-how-a-verdict-moves-with-size). The slope's
variance is the one the seeds give, Σ cᵢ² SEᵢ² with cᵢ = (xᵢ - x̄) / Σ (xⱼ - x̄)², with
Welch-Satterthwaite degrees of freedom (from the scatter of ≥ 3 sizes only when no size has any
spread); with ≥ 3 sizes a χ² test says whether the sizes lie off the line by more than their
seeds explain (the gap moves, but not in a straight line in log x), and the sentence says so.
The interval is Student's t.
The trend word never calls a trend whose interval includes 0. The best value's drift is
log10(best at the largest size / best at the smallest) / 0.5, in half-decades.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from normbench.core.errors import ConfigError
from normbench.report.load import ALIASES, ReportData
from normbench.report.metrics import DEFAULT, metric
from normbench.report.select import same_value
from normbench.report.stats import NEEDS_SEEDS, compare, fit_trend, mean_ci, trend_word
from normbench.report.tables import _fmt_value, config_label, default_group_keys, ran, varying_keys
from normbench.report.tuning import _by_seed, _values, compare_with_best, readings

# The keys a sweep scales; one of them varying alone is the scale axis without --scale.
SIZE_KEYS = (
    "model.d_model",
    "model.n_layer",
    "model.n_head",
    "model.block_size",
    "train.steps",
    "train.batch_size",
)
TOKEN_KEYS = ("train.steps", "train.batch_size")  # a token budget: the trend is against log(tokens)
NEEDS_SIZES = "needs ≥ 2 sizes with ≥ 2 seeds"
# |gap| moving away from 0 / toward 0 as the size grows, the fitted gap crossing 0, slope CI containing 0
TREND_WORDS = ("grows", "shrinks", "flips sign", "no trend", NEEDS_SIZES)


@dataclass
class Scale:
    key: str
    detected: bool  # found as the one size key that varies, not given with --scale
    baseline: str
    baseline_given: bool
    x: str  # "params", "tokens" or the key: what the trend is fitted against (log2)
    configs: list[str]  # best first at the largest size, the baseline first
    run_config: pd.Series  # per run (index of d.runs): its configuration label
    table: pd.DataFrame  # scale.csv
    trend: pd.DataFrame  # trend.csv
    samples: dict  # (configuration, size) -> its completed values of the metric at its best value, by seed
    metric: str = DEFAULT  # the report's --metric (normbench.report.metrics)


def _numeric(series: pd.Series) -> bool:
    return bool(pd.to_numeric(series, errors="coerce").notna().all())


def resolve_scale_key(scale: str | None, d: ReportData) -> tuple[str | None, bool]:
    """(key, detected): None detects a lone varying size key; "none" turns the axis off."""
    varying = varying_keys(d.runs, d.config_keys)
    # as --tune's: the keys that vary, less norm.eps and the like that merely follow the norm's name
    numeric = [
        k
        for k in default_group_keys(d.runs, d.config_keys)
        if k in varying and k != d.tune and _numeric(d.runs[k])
    ]
    if scale is None:
        sizes = [k for k in SIZE_KEYS if k in numeric and k in varying_keys(ran(d.runs), d.config_keys)]
        return (sizes[0], True) if len(sizes) == 1 else (None, False)
    if scale.strip().lower() == "none":
        return None, False
    key = ALIASES.get(scale.strip(), scale.strip())
    allowed = [*numeric, "none"] if numeric else ["none (no numeric config key varies besides --tune)"]
    if key == d.tune:
        raise ConfigError(
            f"--scale {key}: is the tuning key (--tune); the scale axis is another key", allowed=allowed
        )
    if key not in varying:
        raise ConfigError(f"--scale {key}: does not vary among these runs", allowed=allowed)
    if key not in numeric:
        raise ConfigError(f"--scale {key}: not numeric (a size is a number)", allowed=allowed)
    return key, False


def _config_keys(d: ReportData, key: str) -> list[str]:
    return [k for k in d.keys if k not in (d.tune, key)]


def _labels(runs: pd.DataFrame, keys: list[str]) -> list[str]:
    return (
        [config_label(keys, v) or "all runs" for v in runs[keys].itertuples(index=False)]
        if keys
        else ["all runs"] * len(runs)
    )


def resolve_baseline(spec: str | None, d: ReportData, key: str | None) -> str | None:
    """The configuration ``norm=ln,placement=pre`` names (one line listing them when it names none)."""
    if spec is None:
        return None
    if key is None:
        raise ConfigError(
            "--baseline compares across a scale axis, and these runs have none",
            allowed=["--scale KEY with a numeric key that varies"],
        )
    keys = _config_keys(d, key)
    # what --baseline takes, one per configuration: norm=ln,placement=pre,model.param=sp
    configs = list(
        dict.fromkeys(
            ",".join(f"{k}={_fmt_value(v)}" for k, v in zip(keys, values))
            for values in d.runs[keys].itertuples(index=False)
        )
    )
    wanted = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, value = part.partition("=")
        wanted[ALIASES.get(name.strip(), name.strip())] = value.strip()

    match = [
        label
        for label, (_, run) in zip(_labels(d.runs, keys), d.runs.iterrows())
        if wanted and all(k in d.runs and same_value(run[k], v) for k, v in wanted.items())
    ]
    match = list(dict.fromkeys(match))
    if len(match) != 1:
        what = "matches no configuration" if not match else f"matches {len(match)} configurations"
        raise ConfigError(f"--baseline {spec}: {what}", allowed=configs)
    return match[0]


def scale_axis(d: ReportData, key: str, detected: bool, baseline: str | None) -> Scale:
    """The scale axis: each configuration at each size (at its best tuned value), compared with the best
    of its size and with the baseline, and the trend of each difference across the sizes."""
    m = metric(d.metric)
    runs = _scale_runs(d, key)
    table, samples = _at_each_size(d, runs, key, m)
    table = table.merge(_vs_best_of_size(table, samples, key, m), on=["config", key])
    baseline, given, order = _baseline(table, baseline, key, m)
    table = pd.concat([table, _vs_baseline(table, samples, baseline, key)], axis=1)
    table.insert(1, "baseline", baseline)
    table["_order"] = table["config"].map(order.index)
    table = table.sort_values([key, "_order"], kind="stable").drop(columns="_order").reset_index(drop=True)
    x = _x_axis(table, key)
    return Scale(
        key=key,
        detected=detected,
        baseline=baseline,
        baseline_given=given,
        x=x,
        configs=order,
        run_config=runs["_config"],
        table=table,
        trend=_trend(table, key, order, baseline, d.tune),
        samples=samples,
        metric=d.metric,
    )


def _scale_runs(d: ReportData, key: str) -> pd.DataFrame:
    """The runs with their configuration on the axis (_config), as tuned.csv names it (_tconfig), their
    size (_size), tuned value (_value), tokens (_tokens) and parameters (_params)."""
    tkeys = [k for k in d.keys if k != d.tune]  # tuned.csv's configurations
    runs = d.runs.assign(
        _config=_labels(d.runs, _config_keys(d, key)),
        _tconfig=_labels(d.runs, tkeys),
        _size=pd.to_numeric(d.runs[key], errors="coerce"),
    )
    if d.tune:
        runs["_value"] = pd.to_numeric(runs[d.tune], errors="coerce")
    tokens = [
        pd.to_numeric(runs[k], errors="coerce") if k in runs else math.nan
        for k in ("train.steps", "train.batch_size", "model.block_size")
    ]
    runs["_tokens"] = tokens[0] * tokens[1] * tokens[2]
    runs["_params"] = pd.to_numeric(runs["params"], errors="coerce") if "params" in runs else math.nan
    return runs


def _at_each_size(d: ReportData, runs: pd.DataFrame, key: str, m) -> tuple[pd.DataFrame, dict]:
    """(one row per configuration and size: its mean at its best value and interval, sorted by size;
    {(config, size): its seeds' values})."""
    tuned = d.tuned.set_index("config") if d.tuned is not None else None
    rows, samples = [], {}
    for (config, size), group in runs.groupby(["_config", "_size"], sort=False):
        label = group["_tconfig"].iloc[0]
        best = tuned.at[label, "best_value"] if tuned is not None else math.nan
        if tuned is not None:  # its seeds at its best value, read as tuned.csv reads them
            at = group[group["_value"].eq(best)]
            sample = _by_seed(at.assign(_read=readings(at, m)), "_read", completed=False)
        else:
            sample = _by_seed(group, m.source)
        samples[(config, size)] = sample
        values = _values(sample)
        ci = mean_ci(values)
        rows.append(
            {
                "config": config,
                key: size,
                "params": group["_params"].mean(),
                "tokens": group["_tokens"].mean(),
                "tune_key": d.tune,
                "best_value": best,
                f"{m.source}_mean": np.mean(values) if values else math.nan,
                "n_seeds": len(values),
                "ci_low": ci.low if ci else math.nan,
                "ci_high": ci.high if ci else math.nan,
                "ci_method": ci.method if ci else (NEEDS_SEEDS if values else "no completed run"),
                "lr_sensitivity": tuned.at[label, "lr_sensitivity"] if tuned is not None else math.nan,
            }
        )
    return pd.DataFrame(rows).sort_values(key, kind="stable").reset_index(drop=True), samples


def _vs_best_of_size(table: pd.DataFrame, samples: dict, key: str, m) -> pd.DataFrame:
    """The per-size verdict: each configuration against the best of its size."""
    at_size = pd.concat(
        [
            compare_with_best({c: samples[(c, s)] for c in table.loc[table[key].eq(s), "config"]}, m).assign(
                **{key: s}
            )
            for s in sorted(table[key].unique())
        ]
    )
    at_size = at_size.rename_axis("config").reset_index()[
        ["config", key, "diff_vs_best", "diff_ci_low", "diff_ci_high", "vs_best"]
    ]
    return at_size.rename(
        columns={"diff_ci_low": "diff_vs_best_ci_low", "diff_ci_high": "diff_vs_best_ci_high"}
    )


def _baseline(table: pd.DataFrame, baseline: str | None, key: str, m) -> tuple[str, bool, list[str]]:
    """(the baseline: the one given, else the best at the largest size; whether it was given; the
    configurations in order: the baseline first, then best first at the largest size)."""
    largest = table.dropna(subset=[f"{m.source}_mean"])
    largest = largest[largest[key].eq(largest[key].max())].sort_values(
        f"{m.source}_mean", ascending=not m.higher_is_better, kind="stable"
    )
    given = baseline is not None
    baseline = baseline if given else (largest["config"].iloc[0] if len(largest) else table["config"].iloc[0])
    return baseline, given, list(dict.fromkeys([baseline, *largest["config"], *table["config"]]))


def _vs_baseline(table: pd.DataFrame, samples: dict, baseline: str, key: str) -> pd.DataFrame:
    """Each row's difference to the baseline at its size, with its interval, method, se and df."""
    diffs = []
    for _, row in table.iterrows():
        base = samples.get((baseline, row[key]))
        own = row["config"] == baseline  # compared with itself: 0 by definition, no interval
        c = compare(samples[(row["config"], row[key])], base) if base is not None and not own else None
        none = c is None or not math.isfinite(c.diff)
        diffs.append(
            {
                "diff_vs_baseline": 0.0 if own else (math.nan if none else c.diff),
                "diff_ci_low": c.ci.low if c and c.ci else math.nan,
                "diff_ci_high": c.ci.high if c and c.ci else math.nan,
                "diff_method": "baseline" if own else ("no completed run" if none else c.method),
                "diff_se": c.se if c else math.nan,
                "diff_df": c.df if c else math.nan,
            }
        )
    return pd.DataFrame(diffs)


def _x_axis(table: pd.DataFrame, key: str) -> str:
    """What the axis is drawn against (tokens, params, or the key itself), its column ``x`` set."""
    by_size = table.groupby(key)[["params", "tokens"]].mean()
    x = (
        ("tokens" if key in TOKEN_KEYS or by_size["params"].nunique() < 2 else "params")
        if by_size["tokens"].nunique() > 1 or by_size["params"].nunique() > 1
        else key
    )
    table["x"] = table[key] if x == key else table[key].map(by_size[x])
    return x


def _trend(table: pd.DataFrame, key: str, order: list[str], baseline: str, tune: str | None) -> pd.DataFrame:
    rows = []
    for config in order:
        part = table[table["config"].eq(config)]
        fitted = (
            part[part["diff_se"].notna() & part["diff_vs_baseline"].notna()]
            if config != baseline
            else part[:0]
        )
        row = {
            "config": config,
            "baseline": baseline,
            "scale_key": key,
            "sizes": len(part),
            "sizes_fitted": len(fitted),
            "sizes_not_compared": "; ".join(
                f"{_fmt_value(s)} ({m})"
                for s, m in zip(
                    part.loc[~part.index.isin(fitted.index), key],
                    part.loc[~part.index.isin(fitted.index), "diff_method"],
                )
                if config != baseline
            ),
        }
        if config == baseline:
            row["trend"] = "baseline"
        elif fitted["x"].nunique() >= 2:
            fit = fit_trend(fitted["x"], fitted["diff_vs_baseline"], fitted["diff_se"], fitted["diff_df"])
            row.update(
                slope_per_doubling=fit.slope,
                slope_ci_low=fit.low,
                slope_ci_high=fit.high,
                slope_df=fit.df,
                slope_method=f"least squares, t, variance from the {fit.method}",
                fitted_first=fit.first,
                fitted_last=fit.last,
                lack_of_fit_p=fit.lack_of_fit_p,
                trend=trend_word(
                    fit,
                    fitted["diff_vs_baseline"],
                    fitted["diff_ci_low"].dropna(),
                    fitted["diff_ci_high"].dropna(),
                ),
            )
        else:
            row["trend"] = NEEDS_SIZES
        best = part.dropna(subset=["best_value"])
        if tune and len(best) >= 2 and (best["best_value"] > 0).all():
            first, last = best["best_value"].iloc[0], best["best_value"].iloc[-1]
            row.update(
                best_first=first, best_last=last, best_drift_half_decades=math.log10(last / first) / 0.5
            )
        rows.append(row)
    columns = [
        "config",
        "baseline",
        "scale_key",
        "sizes",
        "sizes_fitted",
        "sizes_not_compared",
        "slope_per_doubling",
        "slope_ci_low",
        "slope_ci_high",
        "slope_df",
        "slope_method",
        "fitted_first",
        "fitted_last",
        "lack_of_fit_p",
        "trend",
        "best_first",
        "best_last",
        "best_drift_half_decades",
    ]
    return pd.DataFrame(rows).reindex(columns=columns)


def _x_words(s: Scale) -> str:
    return {"params": "parameters", "tokens": "training tokens"}.get(s.x, s.key)

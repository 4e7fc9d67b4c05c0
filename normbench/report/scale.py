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
from scipy import stats

from normbench.core.errors import ConfigError
from normbench.report.load import ALIASES, ReportData
from normbench.report.metrics import DEFAULT, metric
from normbench.report.stats import CONFIDENCE, NEEDS_SEEDS, compare, mean_ci, satterthwaite
from normbench.report.tables import _fmt_value, config_label, default_group_keys, fmt_ci, ran, varying_keys
from normbench.report.tuning import _by_seed, _values, compare_with_best

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

    def same(value, text):
        number, target = pd.to_numeric(pd.Series([value, text]), errors="coerce")
        return _fmt_value(value) == text or (pd.notna(number) and number == target)

    match = [
        label
        for label, (_, run) in zip(_labels(d.runs, keys), d.runs.iterrows())
        if wanted and all(k in d.runs and same(run[k], v) for k, v in wanted.items())
    ]
    match = list(dict.fromkeys(match))
    if len(match) != 1:
        what = "matches no configuration" if not match else f"matches {len(match)} configurations"
        raise ConfigError(f"--baseline {spec}: {what}", allowed=configs)
    return match[0]


@dataclass(frozen=True)
class Fit:
    slope: float  # per doubling of x
    low: float
    high: float
    df: float
    method: str
    first: float  # the fitted gap at the smallest and largest fitted size
    last: float
    lack_of_fit_p: float = math.nan  # χ² test of the sizes around the line (≥ 3 sizes with seeds)


def fit_trend(x, gap, se, df) -> Fit:
    """Least squares of ``gap`` on log2(``x``), every size weighted alike; the slope's 95% interval from
    the sizes' own standard errors (module doc)."""
    t = np.log2(np.asarray(x, float))
    gap, se, df = (np.asarray(v, float) for v in (gap, se, df))
    positive = se[se > 0]
    seeds = bool(len(positive))
    tc = t - t.mean()
    sxx = float(np.sum(tc**2))
    slope = float(np.sum(tc * gap) / sxx)
    intercept = float(gap.mean() - slope * t.mean())
    k = len(t)
    if seeds:
        # Weights fixed by the design, not by SEs estimated from a few seeds each (1/SE² weights
        # favour the sizes whose seeds happened to agree, and the interval came out too narrow).
        var, dof = satterthwaite((tc / sxx) ** 2 * se**2, df)  # each size's share of the slope's variance
        method = "seeds"
    else:
        var, dof, method = 0.0, math.inf, "no spread"
    lack_of_fit_p = math.nan
    if k >= 3:
        residual = gap - intercept - slope * t
        if seeds:  # do the sizes scatter around the line more than their seeds explain?
            # a size whose seeds all moved alike ("no spread") counts with the smallest SE there is
            chi2 = float(np.sum((residual / np.where(se > 0, se, positive.min())) ** 2))
            lack_of_fit_p = float(stats.chi2.sf(chi2, k - 2))
        else:  # nothing but the scatter to go by
            var, dof, method = (
                float(np.sum(residual**2)) / (k - 2) / sxx,
                float(k - 2),
                "scatter of the sizes",
            )
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, dof) * math.sqrt(var)) if var > 0 else 0.0
    return Fit(
        slope,
        slope - half,
        slope + half,
        dof,
        method,
        intercept + slope * float(t.min()),
        intercept + slope * float(t.max()),
        lack_of_fit_p,
    )


def trend_word(fit: Fit, gaps=(), ci_low=(), ci_high=()) -> str:
    """The trend's word from the slope's interval and the measured gaps at the fitted sizes.

    "flips sign" needs the measured gap to be significantly of both signs (one size's 95% CI
    below 0, another's above), not merely a fitted line crossing 0 (a μP model at its base width
    is the SP model: no gap there, then one that grows). Otherwise the gap grows when the slope
    has the sign of the gaps (their mean: the side of 0 they are on) and shrinks when it has the
    other: judged on the measured gaps, not on the line's ends, which a gap that closes fast and
    levels off would carry past 0.
    """
    if fit.low <= 0 <= fit.high:
        return "no trend"
    if any(h < 0 for h in ci_high) and any(low > 0 for low in ci_low):
        return "flips sign"
    side = np.mean(gaps) if len(gaps) else fit.last
    return "grows" if fit.slope * side > 0 else "shrinks"


def scale_axis(d: ReportData, key: str, detected: bool, baseline: str | None) -> Scale:
    keys = _config_keys(d, key)
    tkeys = [k for k in d.keys if k != d.tune]  # tuned.csv's configurations
    runs = d.runs.assign(
        _config=_labels(d.runs, keys),
        _tconfig=_labels(d.runs, tkeys),
        _size=pd.to_numeric(d.runs[key], errors="coerce"),
    )
    if d.tune:
        runs["_value"] = pd.to_numeric(runs[d.tune], errors="coerce")
    tuned = d.tuned.set_index("config") if d.tuned is not None else None
    tokens = [
        pd.to_numeric(runs[k], errors="coerce") if k in runs else math.nan
        for k in ("train.steps", "train.batch_size", "model.block_size")
    ]
    runs["_tokens"] = tokens[0] * tokens[1] * tokens[2]
    runs["_params"] = pd.to_numeric(runs["params"], errors="coerce") if "params" in runs else math.nan
    m = metric(d.metric)
    rows, samples = [], {}
    for (config, size), group in runs.groupby(["_config", "_size"], sort=False):
        label = group["_tconfig"].iloc[0]
        best = tuned.at[label, "best_value"] if tuned is not None else math.nan
        sample = samples[(config, size)] = _by_seed(
            group[group["_value"].eq(best)] if tuned is not None else group, m.source
        )
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
    table = pd.DataFrame(rows).sort_values(key, kind="stable").reset_index(drop=True)
    sizes = sorted(table[key].unique())
    # the per-size verdict: each configuration against the best of its size
    at_size = pd.concat(
        [
            compare_with_best({c: samples[(c, s)] for c in table.loc[table[key].eq(s), "config"]}, m).assign(
                **{key: s}
            )
            for s in sizes
        ]
    )
    at_size = at_size.rename_axis("config").reset_index()[
        ["config", key, "diff_vs_best", "diff_ci_low", "diff_ci_high", "vs_best"]
    ]
    table = table.merge(
        at_size.rename(
            columns={"diff_ci_low": "diff_vs_best_ci_low", "diff_ci_high": "diff_vs_best_ci_high"}
        ),
        on=["config", key],
    )
    largest = table.dropna(subset=[f"{m.source}_mean"])
    largest = largest[largest[key].eq(largest[key].max())].sort_values(
        f"{m.source}_mean", ascending=not m.higher_is_better, kind="stable"
    )
    given = baseline is not None
    baseline = baseline if given else (largest["config"].iloc[0] if len(largest) else table["config"].iloc[0])
    # configurations: the baseline first, then best first at the largest size
    order = list(dict.fromkeys([baseline, *largest["config"], *table["config"]]))
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
    table = pd.concat([table, pd.DataFrame(diffs)], axis=1)
    table.insert(1, "baseline", baseline)
    table["_order"] = table["config"].map(order.index)
    table = table.sort_values([key, "_order"], kind="stable").drop(columns="_order").reset_index(drop=True)
    by_size = table.groupby(key)[["params", "tokens"]].mean()
    x = (
        ("tokens" if key in TOKEN_KEYS or by_size["params"].nunique() < 2 else "params")
        if by_size["tokens"].nunique() > 1 or by_size["params"].nunique() > 1
        else key
    )
    table["x"] = table[key] if x == key else table[key].map(by_size[x])
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


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _gap(row) -> str:
    if row["diff_method"] == "no completed run" or pd.isna(row["diff_vs_baseline"]):
        return f"no completed run at {_fmt_value(row['_size'])}"
    ci = fmt_ci(row, "diff_ci_low", "diff_ci_high", "+") if pd.notna(row["diff_ci_low"]) else NEEDS_SEEDS
    return f"{row['diff_vs_baseline']:+.3f} {ci} at {_fmt_value(row['_size'])}"


def _x_words(s: Scale) -> str:
    return {"params": "parameters", "tokens": "training tokens"}.get(s.x, s.key)


def size_verdicts(s: Scale) -> list[str]:
    """The verdict with a size axis: at each size, its configurations against the best of that size
    (never a small model against a large one); the trend section says how it moves."""
    t, key, short, m = s.table, s.key, _short(s.key), metric(s.metric)
    out = []
    for size in sorted(t[key].unique()):
        at = t[t[key].eq(size)]
        best = at[at["vs_best"].eq("best")]
        if best.empty:
            out.append(f"At {short}={_fmt_value(size)}: no configuration completed a run.")
            continue
        b = best.iloc[0]
        where = f" at {s.table['tune_key'].iloc[0]}={b['best_value']:g}" if pd.notna(b["best_value"]) else ""
        parts = [
            f"At {short}={_fmt_value(size)}: best {b['config']}{where}, {m.label} "
            f"{m.value(b[f'{m.source}_mean'])}"
        ]
        for word, name in (("tied", "tied"), ("worse", "worse")):
            rows = at[at["vs_best"].eq(word)]
            if len(rows):
                parts.append(
                    f"{name}: "
                    + ", ".join(
                        f"{r['config']} {m.diff(r['diff_vs_best'])} "
                        f"{fmt_ci(r, 'diff_vs_best_ci_low', 'diff_vs_best_ci_high', '+')}"
                        for _, r in rows.iterrows()
                    )
                )
        thin = at[at["vs_best"].eq(NEEDS_SEEDS)]
        if len(thin):
            parts.append(
                "not compared ("
                + NEEDS_SEEDS
                + "): "
                + ", ".join(f"{r['config']} (n={r['n_seeds']})" for _, r in thin.iterrows())
            )
        if b["n_seeds"] < 2:
            parts.append(f"the best has n={b['n_seeds']}: {NEEDS_SEEDS} to compare anything at this size")
        out.append("; ".join(parts) + ".")
    return out


def scale_verdict(s: Scale) -> list[str]:
    """The trend section's sentences: the axis, each comparison's trend, the best value's drift
    (each size's own verdict is the report's verdict: ``size_verdicts``)."""
    t, key, m = s.table.assign(_size=s.table[s.key]), s.key, metric(s.metric)
    sizes = sorted(t[key].unique())
    how = "detected: the one size key that varies" if s.detected else "given with --scale"
    base = "given with --baseline" if s.baseline_given else "default: the best at the largest size"
    x = {"params": "the parameters", "tokens": "the training tokens (steps x batch x block)"}.get(
        s.x, f"{key} itself"
    )
    out = [
        f"Scale axis {key} ({how}): sizes {', '.join(map(_fmt_value, sizes))}. Each configuration is "
        "compared with "
        f"the baseline {s.baseline} ({base}) at each size, difference = configuration - baseline in "
        f"{m.label} ({m.unit or 'no unit'}; positive: {'better' if m.higher_is_better else 'worse'} than the "
        "baseline), and the difference is fitted against log2 of "
        f"{x} by least squares (t interval on the slope from the seeds' standard errors)."
    ]
    for trend in s.trend.itertuples(index=False):
        if trend.config == s.baseline:
            continue
        gaps = "; ".join(_gap(r) for _, r in t[t["config"].eq(trend.config)].iterrows())
        head = f"{trend.config} - {s.baseline} ({gaps})"
        if trend.trend == NEEDS_SIZES:
            out.append(f"{head}: no trend claimed, {NEEDS_SIZES} on both sides.")
            continue
        slope = (
            f"slope {trend.slope_per_doubling:+.4f} per doubling of the {_x_words(s)}, 95% CI "
            f"[{trend.slope_ci_low:+.4f}, {trend.slope_ci_high:+.4f}] over {trend.sizes_fitted} sizes "
            f"({trend.slope_df:.1f} df, variance from the {trend.slope_method.rsplit('from the ', 1)[-1]})"
        )
        words = {
            "grows": "the gap grows with size (|gap| moves away from 0)",
            "shrinks": "the gap shrinks with size (|gap| moves toward 0)",
            "flips sign": (
                f"the gap changes sign across the sizes (fitted {trend.fitted_first:+.3f} at the "
                f"smallest, {trend.fitted_last:+.3f} at the largest)"
            ),
            "no trend": "the gap shows no trend (the slope's 95% CI includes 0)",
        }
        left = f"; not in the fit: {trend.sizes_not_compared}" if trend.sizes_not_compared else ""
        bent = (
            f"; the sizes lie off a straight line in log {_x_words(s)} by more than their seeds explain "
            f"(χ² p = {trend.lack_of_fit_p:.2g}): the gap moves unevenly, read it size by size"
            if trend.lack_of_fit_p < 0.05
            else ""
        )
        out.append(f"{head}: {words[trend.trend]}; {slope}{left}{bent}.")
    tune = s.table["tune_key"].iloc[0]
    if isinstance(tune, str) and tune:
        parts = []
        for config in s.configs:
            part = t[t["config"].eq(config)]
            values = ", ".join("–" if pd.isna(v) else f"{v:g}" for v in part["best_value"])
            drift = s.trend.set_index("config").at[config, "best_drift_half_decades"]
            parts.append(
                f"{config} {values}" + (f" (drift {drift:+.1f} half-decades)" if pd.notna(drift) else "")
            )
        out.append(
            f"Best {tune} per size ({', '.join(map(_fmt_value, sizes))}): {'; '.join(parts)}; the drift is "
            f"log10(best at the largest / best at the smallest size) / 0.5, 0 when the best value transfers."
        )
        sens = "; ".join(
            f"{c} "
            + ", ".join("–" if pd.isna(v) else f"{v:.3f}" for v in t.loc[t["config"].eq(c), "lr_sensitivity"])
            for c in s.configs
        )
        out.append(
            f"{tune} sensitivity per size (Wortsman et al. 2023, as in the verdict; point values): {sens}."
        )
    return out


def scale_tables(s: Scale) -> tuple[pd.DataFrame, pd.DataFrame]:
    """scale.csv and trend.csv as short strings, for the terminal, Markdown and HTML."""
    t, key, m = s.table, s.key, metric(s.metric)

    def num(value, spec):
        return "–" if pd.isna(value) else format(value, spec)

    tune = t["tune_key"].iloc[0]
    per_size = pd.DataFrame(
        {
            "configuration": t["config"],
            _short(key): t[key].map(_fmt_value),
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

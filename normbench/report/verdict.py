"""The verdict: a few generated sentences, each with its numbers, at the top of every report.

Every claim of a difference rests on a 95% interval that excludes 0 (normbench.report.stats);
a difference whose interval includes 0 is called a tie, one without an interval is not
called anything. The verdict says so when the evidence is too thin (one seed, one learning
rate, a best value at the edge of the grid). With a size axis (--scale) the configurations are
compared within each size, never a small model with a large one (``size_verdicts``), and the trend
section says how each comparison moves with the size (``scale_verdict``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from normbench.core.provenance import describe
from normbench.core.runs import LEARN_MARGIN
from normbench.report.cost import implementation_note
from normbench.report.load import LEARNED_FRACTION, NOT_RECORDED, NUMERICS, ReportData, layer_skip
from normbench.report.metrics import Metric, metric
from normbench.report.recipe import differences
from normbench.report.scale import NEEDS_SIZES, Scale, _x_words
from normbench.report.stats import NEEDS_SEEDS, compare
from normbench.report.tables import _fmt_value, config_label, fmt_ci, short_key
from normbench.report.tuning import at_best, failed_note, tuned_configs

RERUN = "the same normbench sweep command and --retry-failed"


def _p(p: float) -> str:
    if not math.isfinite(p):
        return ""
    return ", p<0.001" if p < 1e-3 else f", p={p:.2g}"


FEW_SEEDS = 2  # an interval from this many seeds (a side) comes with a warning


def _few(*n) -> str:
    """'; from 2 seeds: a fragile interval' where an interval rests on FEW_SEEDS seeds (a side)."""
    return f"; from {FEW_SEEDS} seeds: a fragile interval" if min(n) <= FEW_SEEDS else ""


def _diff(row, m: Metric, n_best: int) -> str:
    """'+0.310 [+0.290, +0.330] (95%, n=3 and 3, paired by seed, t, p<0.001)': the difference to the
    best, its interval's level and the seeds on each side."""
    return (
        f"{m.diff(row['diff_vs_best'])} {fmt_ci(row, 'diff_ci_low', 'diff_ci_high', '+')} "
        f"(95%, n={row['n']} and {n_best}, {row['test']}{_p(row['p_value'])}{_few(row['n'], n_best)})"
    )


def _list(items: list[str]) -> str:
    return "; ".join(items)


def _configurations(d: ReportData) -> pd.DataFrame:
    """One row per configuration as compared: config, at, mean, n, the interval and vs-best columns."""
    source = metric(d.metric).source
    if d.tune:
        t = d.tuned
        return t.assign(
            at=[f" at {d.tune}={v:g}" if pd.notna(v) else "" for v in t["best_value"]],
            mean=t[f"{source}_mean"],
            n=t["n_seeds"],
        )
    a = d.agg
    return a.assign(at="", mean=a[f"{source}_mean"], n=a[f"{source}_count"])


def _evidence(d: ReportData, table: pd.DataFrame) -> list[str]:
    out = []
    n = table["n"]
    seeds = f"{n.min()}" if n.min() == n.max() else f"{n.min()} to {n.max()}"
    out.append(
        f"{len(d.runs)} runs, {len(table)} configurations, {seeds} completed seed(s) per configuration"
        + (
            f" at its best {d.tune} (a diverged seed ranked with its configuration's worst completed run)."
            if d.tune
            else "."
        )
    )
    if n.max() < 2:
        out.append(
            "Evidence too thin: one completed seed per configuration gives no confidence interval, so "
            "no configuration is called better, worse or tied; run more seeds (seed=0,1,2)."
        )
    lr = pd.to_numeric(d.runs.get("train.lr"), errors="coerce") if "train.lr" in d.runs else None
    if d.tune is None and lr is not None and lr.nunique() == 1:
        out.append(
            f"Every run used one learning rate (train.lr={lr.iloc[0]:g}): each configuration is compared "
            "there, not at its own best; sweep train.lr (e.g. 1e-3,3e-3,1e-2,3e-2) and the report tunes it."
        )
    if d.tune:
        edge = []
        for row in d.tuned.itertuples(index=False):
            grid = [float(v) for v in row.grid.split()] if row.grid else []
            if len(grid) >= 2 and pd.notna(row.best_value) and row.best_value in (grid[0], grid[-1]):
                edge.append(f"{row.config} ({row.best_value:g})")
        if edge:
            out.append(
                f"Best {d.tune} at the edge of the grid, so the true best may lie outside it (extend the "
                f"grid): {_list(edge)}."
            )
        fewer = [
            f"{row.config} at {row.best_value:g} (n={row.n_seeds}; up to {row.n_seeds_most} at other values)"
            for row in d.tuned.itertuples(index=False)
            if pd.notna(row.best_value) and row.n_seeds < row.n_seeds_most
        ]
        if fewer:
            out.append(f"Best {d.tune} resting on fewer seeds than other values of the grid: {_list(fewer)}.")
        single = list(d.tuned.loc[d.tuned["values"] < 2, "config"])
        if single:
            out.append(
                f"Only one {d.tune} swept, so compared there and not at a tuned best: {_list(single)}."
            )
    return out


def _comparisons(table: pd.DataFrame, m: Metric) -> list[str]:
    out = []
    best = table[table["vs_best"].eq("best")]
    if best.empty:
        return [f"No completed run reported its {m.label} ({m.name}): nothing to compare."]
    b = best.iloc[0]
    ci = (
        f"95% CI {fmt_ci(b)}, {b['ci_method']}, n={b['n']}{_few(b['n'])}"
        if pd.notna(b["ci_low"])
        else f"n={b['n']}, {NEEDS_SEEDS} for an interval"
    )
    out.append(f"Best: {b['config']}{b['at']}, {m.label} {m.value(b['mean'])} ({ci}).")
    tied = [
        f"{r['config']}{r['at']} {_diff(r, m, b['n'])}"
        for _, r in table[table["vs_best"].eq("tied")].iterrows()
    ]
    worse = [
        f"{r['config']}{r['at']} by {_diff(r, m, b['n'])}"
        for _, r in table[table["vs_best"].eq("worse")].iterrows()
    ]
    other = table[~table["vs_best"].isin(["best", "tied", "worse", "no completed run", NEEDS_SEEDS])]
    thin = table[table["vs_best"].eq(NEEDS_SEEDS)]
    none = table[table["vs_best"].eq("no completed run")]
    if tied:
        out.append(f"Tied with the best (the 95% CI of the difference includes 0): {_list(tied)}.")
    if worse:
        out.append(f"Worse than the best (the 95% CI of the difference excludes 0): {_list(worse)}.")
    for _, r in other.iterrows():
        out.append(f"{r['config']}{r['at']}: {r['vs_best']} than the best, {_diff(r, m, b['n'])}.")
    if len(thin) and table["n"].max() >= 2:
        out.append(
            "Not compared ("
            + NEEDS_SEEDS
            + " on both sides): "
            + _list([f"{r['config']}{r['at']} (n={r['n']})" for _, r in thin.iterrows()])
            + "."
        )
    if len(none):
        out.append("Nothing completed (every run diverged or failed): " + _list(list(none["config"])) + ".")
    return out


def _recipes(d: ReportData) -> list[str]:
    """What each configuration ran with beyond its keys, where that differs between them (its init,
    tied head, warm-up: normbench.report.recipe), and its tuned value beside it."""
    groups = tuned_configs(d) if d.tune else d.runs["config"]
    best = d.tuned.set_index("config")["best_value"] if d.tune else {}
    also = {c: f"{d.tune}={v:g}" for c, v in dict(best).items() if pd.notna(v)} if d.tune else {}
    said = differences(d.runs, groups, also)
    if not any(said.values()) or all(v == also.get(c, "") for c, v in said.items()):
        return []  # nothing beyond the tuned value, which the comparisons name
    return [
        f"What each configuration ran with beyond its keys: {_list([f'{c}: {v}' for c, v in said.items()])}."
    ]


def _failures(d: ReportData) -> list[str]:
    out = []
    if d.tune:
        diverged = [
            f"{r.config} at {d.tune} {r.diverged_at}"
            for r in d.tuned.itertuples(index=False)
            if r.diverged_at
        ]
        failed = [
            f"{r.config} at {d.tune} {r.failed_at}" for r in d.tuned.itertuples(index=False) if r.failed_at
        ]
    else:
        diverged = [
            f"{r.config} ({r.diverged}/{r.runs} runs)" for r in d.agg.itertuples(index=False) if r.diverged
        ]
        failed = [f"{r.config} ({r.failed}/{r.runs} runs)" for r in d.agg.itertuples(index=False) if r.failed]
    if diverged:
        out.append(f"Diverged (seeds per value): {_list(diverged)}.")
    if failed:
        out.append(f"Failed (see the error column of summary.csv): {_list(failed)}.")
    stuck = [
        f"{r.config} ({r.did_not_learn}/{r.runs} runs)"
        for r in d.agg.itertuples(index=False)
        if r.did_not_learn
    ]
    if stuck:
        out.append(
            f"Did not learn (completed, its final validation loss at or above {LEARNED_FRACTION:.0%} of its "
            f"loss at init, or less than {LEARN_MARGIN} below its unigram loss): {_list(stuck)}."
        )
    if note := failed_note(d.runs, RERUN):
        out.append(f"{note}.")
    return out


def _sensitivity(d: ReportData) -> list[str]:
    if not d.tune:
        return []
    m = metric(d.metric)
    if not m.loss:
        return [
            f"{d.tune} sensitivity not computed: it measures a loss against its value at init, and "
            f"{m.label} is not a loss."
        ]
    t = d.tuned.dropna(subset=["lr_sensitivity"]).sort_values("lr_sensitivity", kind="stable")
    one_value = list(d.tuned.loc[d.tuned["values"] < 2, "config"])
    out = [f"{d.tune} sensitivity not computed for {_list(one_value)}: one value swept."] if one_value else []
    if t.empty:
        return out or [f"{d.tune} sensitivity not computed: the runs have no step-0 evaluation (older runs)."]
    grids = t["grid"].unique()
    values = _list([f"{r.config} {r.lr_sensitivity:.3f}" for r in t.itertuples(index=False)])
    text = (
        f"{d.tune} sensitivity (Wortsman et al. 2023: mean excess of the {m.label} over each "
        "configuration's "
        f"best across the grid, a diverged value counting as the value at init, in {m.unit}; lower = more "
        f"robust; a point value, no interval): {values}."
    )
    if len(grids) == 1:
        text += f" Grid: {grids[0]}."
    else:
        text += (
            " The configurations were swept over different grids ("
            + _list(list(grids))
            + "): sensitivities on different grids are not comparable."
        )
    return [text, *out]


def _leaks(d: ReportData) -> list[str]:
    leaking = d.runs[[v is True or v == 1 for v in d.runs["leaks_future"]]]
    if leaking.empty:
        return []
    keys = [k for k in d.keys if k != d.tune]
    configs = dict.fromkeys(
        config_label(keys, v) or "all runs" for v in leaking[keys].itertuples(index=False)
    )
    return [
        f"Leaks the future in training mode (the norm pools statistics over the batch and the sequence): "
        f"{_list(list(configs))}; the training loss of these runs is optimistic, their validation loss "
        f"(eval mode) is not."
    ]


# A run's tokens/s is compared with another's only when it rests on this many steps past warm-up
# (summary.json's timed_steps: the first log window, torch.compile's compilation included, left out).
MIN_TIMED_STEPS = 50
# What the runs compared must share: the device, the model's shape, the tokens per step, the precision.
SPEED_ALIKE = (
    "provenance.device",
    "provenance.device_name",
    "model.n_layer",
    "model.d_model",
    "model.n_head",
    "model.block_size",
    "train.batch_size",
    "train.precision",
)


def speed_incomparable(runs: pd.DataFrame) -> str | None:
    """Why the completed runs' tokens/s cannot be compared between norms, or None when they can."""
    timed = pd.to_numeric(runs["timed_steps"], errors="coerce") if "timed_steps" in runs else None
    if timed is None or timed.isna().any():
        return "their summaries do not say how many steps were timed past warm-up"
    if (timed < MIN_TIMED_STEPS).any():
        return f"a run timed {int(timed.min())} steps past warm-up (fewer than {MIN_TIMED_STEPS})"
    differ = [k for k in SPEED_ALIKE if k in runs and runs[k].astype(str).nunique() > 1]
    return f"the runs differ in {', '.join(differ)}" if differ else None


def _throughput(d: ReportData) -> list[str]:
    ran = d.runs.dropna(subset=["tokens_per_s"])
    norms = list(dict.fromkeys(ran["norm"].dropna()))
    if "norm" not in d.keys or len(norms) < 2:
        return []
    ref = "ln" if "ln" in norms else norms[0]
    runs = ran[ran["status"].eq("completed")]  # a diverged run's steps are no steady state
    why = speed_incomparable(runs) if set(runs["norm"]) >= set(norms) else "a norm has no completed run"
    if why:
        return [f"Throughput not compared: {why}. {implementation_note(d.bench, norms)}".rstrip()]
    base = runs.loc[runs["norm"].eq(ref), "tokens_per_s"].tolist()
    parts = []
    for norm in [n for n in norms if n != ref]:
        speed = runs.loc[runs["norm"].eq(norm), "tokens_per_s"].tolist()
        c = compare(speed, base)
        ratio = sum(speed) / len(speed) / (sum(base) / len(base))
        if c.ci is None:
            call = NEEDS_SEEDS
        elif c.tied:
            call = "no difference shown: the CI includes 0"
        else:
            call = "faster in these runs" if c.ci.low > 0 else "slower in these runs"
        parts.append(f"{norm} {ratio:.2f}x {ref} ({call})")
    return [
        f"Throughput against {ref} (training runs' whole steps: the ratio of mean tokens/s over the "
        "completed runs of each norm, higher is faster; Welch 95% CI of the difference; normbench check "
        "times the norm's op alone, a ratio of times): "
        f"{_list(parts)}. Runs that trained at different times on a shared machine differ by its load as "
        f"well; normbench bench compares the norms' speed under control. "
        # the caveat: which norms' implementations are not at their limit (or that it is unknown)
        f"{implementation_note(d.bench, norms)}".rstrip()
    ]


def _at_best_runs(d: ReportData, frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of completed runs at their configuration's best value of the tuned key."""
    frame = at_best(d, frame)
    return frame[frame["run"].isin(d.runs.index[d.runs["status"].eq("completed")])]


def _ends(frame: pd.DataFrame, y: str) -> pd.Series:
    """Per run: its last layer's ``y`` over its first layer's (runs with ≥ 3 layers)."""
    wide = frame.dropna(subset=[y]).pivot_table(index="run", columns="layer", values=y)
    if wide.shape[1] < 3:  # no statistics, or too shallow a model for a profile
        return pd.Series(dtype=float)
    return (wide.iloc[:, -1] / wide.iloc[:, 0]).dropna()


def _depth(d: ReportData) -> list[str]:
    """The depth claims, where the runs carry them: the gradient profile per placement (Mix-LN),
    the residual variance and each layer's contribution per configuration (the curse of depth)."""
    out = []
    labels, placements = tuned_configs(d), d.runs["placement"]
    first = _at_best_runs(d, d.layers[d.layers["when"].eq("first")])
    last = _at_best_runs(d, d.layers[d.layers["when"].eq("last")])

    def geometric(ratios: pd.Series, by: pd.Series) -> pd.Series:
        """The geometric mean of the runs' ratios per value of ``by`` (ratios multiply)."""
        ratios = ratios[ratios > 0]
        return np.exp(np.log(ratios).groupby(by.reindex(ratios.index).to_numpy()).mean())

    at_end, at_init = (geometric(_ends(f, "grad_layer"), placements) for f in (last, first))
    if len(at_end) >= 2:
        parts = [
            f"{p} {at_init.get(p, np.nan):.2f}x at init, {r:.2f}x at the last record"
            for p, r in at_end.items()
        ]
        out.append(
            "Gradient norm by depth, last layer / first layer (each layer's weights together, geometric "
            f"mean over runs): {_list(parts)}. Below 1 the deep layers get the smaller gradients (Pre-LN's "
            "pattern in Mix-LN, arXiv 2412.13795), above 1 the early ones (Post-LN's); Mix-LN aims between."
        )
    skip = _at_best_runs(d, layer_skip(d))
    if len(skip) and skip["layer"].max() >= 2:
        variance = geometric(_ends(last, "resid_var"), labels)
        rise = skip.assign(config=skip["run"].map(labels)).groupby(["config", "layer"])["skip_rise"].mean()
        parts = []
        for config, r in rise.groupby(level=0):
            r = r.to_numpy()
            deep = r[len(r) // 2 :].clip(min=0).sum() / max(r.clip(min=0).sum(), 1e-12)
            grow = (
                f", residual variance last/first layer {variance[config]:.1f}x" if config in variance else ""
            )
            parts.append(
                f"{config}: skipping the first layer {r[0]:+.3f}, the last {r[-1]:+.3f}, the deeper half "
                f"{100 * deep:.0f}% of the summed rise{grow}"
            )
        out.append(
            "What each layer contributes (the validation loss with it skipped, minus the full model's; "
            f"mean over runs): {_list(parts)}. The curse of depth (Sun et al. 2025): under Pre-LN the "
            "variance grows with depth and the deep layers matter little; LayerNorm Scaling should even it "
            "out."
        )
    return out


def _labels(d: ReportData) -> pd.Series:
    """Each run's configuration as the verdict names it (without the tuned key)."""
    return tuned_configs(d) if d.tune else d.runs["config"]


def _mixed(d: ReportData, column: str, what: str) -> list[str]:
    """'Mixed {what}: v1 (configs); v2 (configs).' when the runs' ``column`` takes more than one value."""
    values = d.runs[column].astype(str)
    if values.nunique() < 2:
        return []
    if column == "provenance.norm_impl":
        # 'ln=eager' beside 'rms=fused-cpu' is two norms, each by its one path: mixed only when one norm
        # ran by two paths
        kinds = [pair.split("=", 1)[0] for pair in {p for value in values for p in value.split()}]
        if len(kinds) == len(set(kinds)):
            return []
    labels = _labels(d)
    parts = [
        f"{value} ({', '.join(dict.fromkeys(labels[values.eq(value)]))})" for value in sorted(values.unique())
    ]
    return [f"Mixed {what}, which configurations ran each: {_list(parts)}."]


def mixed_provenance(d: ReportData) -> list[str]:
    """One sentence per kind of mix among the runs: numerics versions (different computations, compared
    only with --allow-mixed), torch versions, norm implementations."""
    return [
        *_mixed(d, NUMERICS, "numerics versions (the runs are not the same computation)"),
        *_mixed(d, "provenance.torch", "torch versions"),
        *_mixed(d, "provenance.norm_impl", "norm implementations"),
    ]


def provenance_summary(runs: pd.DataFrame) -> str:
    """One line: the runs' commit(s), torch, device, precision, compile, numerics, norm implementations
    (a field no run recorded left out)."""
    columns = [c for c in runs if c.startswith("provenance.")]
    blocks = [
        {c.removeprefix("provenance."): v for c, v in zip(columns, row) if str(v) != NOT_RECORDED}
        for row in runs[columns].itertuples(index=False)
    ]
    return describe(blocks)


def _gap(row) -> str:
    if row["diff_method"] == "no completed run" or pd.isna(row["diff_vs_baseline"]):
        return f"no completed run at {_fmt_value(row['_size'])}"
    ci = fmt_ci(row, "diff_ci_low", "diff_ci_high", "+") if pd.notna(row["diff_ci_low"]) else NEEDS_SEEDS
    return f"{row['diff_vs_baseline']:+.3f} {ci} at {_fmt_value(row['_size'])}"


def size_verdicts(s: Scale) -> list[str]:
    """The verdict with a size axis: at each size, its configurations against the best of that size
    (never a small model against a large one); the trend section says how it moves."""
    t, key, short, m = s.table, s.key, short_key(s.key), metric(s.metric)
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


def verdict(d: ReportData) -> list[str]:
    """The report's verdict, one sentence (or a short list) per item."""
    table = _configurations(d)
    return [
        *_evidence(d, table),
        *(size_verdicts(d.scale) if d.scale is not None else _comparisons(table, metric(d.metric))),
        *_recipes(d),
        *_failures(d),
        *mixed_provenance(d),
        *_sensitivity(d),
        *_leaks(d),
        *_throughput(d),
        *_depth(d),
    ]

"""The tuning axis: each configuration at its best value of one key (the learning rate), its LR
sensitivity, and how the configurations compare with the best one over seeds.

Everything here is about the report's metric (``--metric``, normbench.report.metrics; the final
validation loss by default). A *configuration* is a combination of the group keys without the
tuning key. For each one:

- its best value: the value whose seeds have the best mean score (``scores``: the lowest; the
  highest for a metric where higher is better). Every seed that ran counts: for a loss, a seed that
  diverged scores its loss at initialisation (it learned nothing). Choosing on the survivors of a
  value where most seeds diverged is choosing on a censored sample: the lone survivor of a rate that
  is mostly unstable looks best exactly because the unlucky seeds were dropped. A run that *failed*
  (crashed: an error, not a result) counts for nothing: it is left out of every mean and every
  choice, and the report says how many were left out and how to run them again;
- its seeds at the best value, compared (``readings``): a seed that diverged *there* is ranked
  worst, a worst-rank score (Lachin 1999, "Worst-rank score analysis with informatively missing
  observations in clinical trials"): it reads the worst loss a completed seed of its configuration
  reached at that value (its loss at init where none completed): tied with the worst seed, never
  ranked above one. The divergence is evidence that the configuration is worse and counts as such;
  its value is bounded by what the configuration's own seeds reached there, where its loss at init
  (far above every trained loss) would add a spread that turns an effect every seed shows into an
  interval that decides nothing;
- its LR sensitivity, as Wortsman et al. (2023, "Small-scale proxies for large-scale Transformer
  training instabilities", §2.2) define it: the mean over the swept values η of
  ``min(loss(η), loss_init) - loss*``, where ``loss(η)`` is the mean metric over the seeds at η,
  ``loss_init`` its value at step 0 and ``loss*`` the lowest ``loss(η)``. A seed that diverged at
  η counts as ``loss_init`` (it learned nothing: the definition's ceiling), and the min is taken per
  seed, before the mean; a failed run is left out. It depends on the grid: sensitivities over
  different grids are not comparable. It is
  defined for a loss only (a throughput has no value at init);
- the seed statistics of normbench.report.stats at its best value: the mean's 95% interval, and
  the difference to the best configuration (of the same size, with a scale axis) with its
  interval and p-value.

The same comparison without a tuning key (``seed_statistics``) fills aggregate.csv. The choice of
a configuration's runs at its best value (``at_best_value``, over ``scores``) is the claims
registry's too (normbench.claims.arms): the report and a claim read the same runs one way. The
choice is made on the seeds then compared; a claim's pilot is decided again by its confirmation on
fresh seeds at the value the pilot chose (normbench.claims.confirming), which no choice can flatter.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from normbench.core.errors import ConfigError
from normbench.report.load import ReportData
from normbench.report.metrics import Metric, metric
from normbench.report.stats import NEEDS_SEEDS, compare, mean_ci
from normbench.report.tables import config_label, default_group_keys, ran, varying_keys

STAT_COLUMNS = (
    "ci_low",
    "ci_high",
    "ci_method",
    "diff_vs_best",
    "diff_ci_low",
    "diff_ci_high",
    "p_value",
    "test",
    "vs_best",
)


def resolve_tune_key(tune: str | None, d: ReportData) -> str | None:
    """``None``: train.lr when it varies among the runs; "none": no tuning; else a key that varies."""
    varying = varying_keys(d.runs, d.config_keys)
    if tune is None:
        return "train.lr" if "train.lr" in varying_keys(ran(d.runs), d.config_keys) else None
    if tune.strip().lower() == "none":
        return None
    key = tune.strip()
    numeric = [
        k
        for k in default_group_keys(d.runs, d.config_keys)
        if k in varying and pd.to_numeric(d.runs[k], errors="coerce").notna().all()
    ]
    allowed = [*numeric, "none"] if numeric else ["none (no numeric config key varies among these runs)"]
    if key not in d.runs:
        raise ConfigError(f"--tune {key}: not a config key of these runs", allowed=allowed)
    if key not in varying:
        raise ConfigError(f"--tune {key}: does not vary among these runs", allowed=allowed)
    if pd.to_numeric(d.runs[key], errors="coerce").isna().any():
        raise ConfigError(
            f"--tune {key}: not numeric (tuning picks the best of a numeric grid)", allowed=allowed
        )
    return key


def _by_seed(runs: pd.DataFrame, column: str, completed: bool = True) -> dict | list:
    """Runs' ``column`` (completed runs' only with ``completed``; any run with a value without) as
    {seed: value} when the seeds are distinct, else a plain list."""
    done = runs[(runs["status"].eq("completed") | (not completed)) & runs[column].notna()]
    seeds = done["seed"].tolist()
    if len(set(seeds)) == len(seeds) and not done["seed"].isna().any():
        return dict(zip(seeds, done[column]))
    return done[column].tolist()


def _values(sample) -> list:
    return list(sample.values()) if isinstance(sample, dict) else list(sample)


def compare_with_best(samples: dict, m: Metric, sizes: dict | None = None) -> pd.DataFrame:
    """Per label: the mean's 95% interval and the comparison with the best label (of its size).

    ``samples`` maps a label to {seed: value} (or a list of values) of the metric ``m``, in display
    order; the best has the lowest mean, or the highest for a metric where higher is better.
    ``sizes`` maps each label to its size on the scale axis: a label is only ever compared with
    the best of its own size.
    """
    sizes = sizes or {}
    means = {label: np.mean(_values(s)) if _values(s) else math.nan for label, s in samples.items()}
    best = {}
    for label, mean in means.items():
        size, current = sizes.get(label), best.get(sizes.get(label))
        if math.isfinite(mean) and (
            current is None or (mean > means[current] if m.higher_is_better else mean < means[current])
        ):
            best[size] = label
    rows = []
    for label, sample in samples.items():
        ci = mean_ci(_values(sample))
        top = best.get(sizes.get(label))
        row = {
            "ci_low": ci.low if ci else math.nan,
            "ci_high": ci.high if ci else math.nan,
            "ci_method": ci.method if ci else (NEEDS_SEEDS if _values(sample) else "no completed run"),
        }
        if label == top:
            row.update(diff_vs_best=0.0, vs_best="best")
        elif not math.isfinite(means[label]) or top is None:
            row.update(vs_best="no completed run")
        else:
            c = compare(sample, samples[top])
            worse = c.ci is not None and (c.ci.high < 0 if m.higher_is_better else c.ci.low > 0)
            row.update(
                diff_vs_best=c.diff,
                diff_ci_low=c.ci.low if c.ci else math.nan,
                diff_ci_high=c.ci.high if c.ci else math.nan,
                p_value=c.p,
                test=c.method,
                vs_best=NEEDS_SEEDS
                if c.ci is None
                else ("tied" if c.tied else ("worse" if worse else "better")),
            )
        rows.append(row)
    return pd.DataFrame(rows, index=list(samples), columns=list(STAT_COLUMNS))


def _sizes(d: ReportData, frame: pd.DataFrame) -> dict | None:
    """config -> size on the scale axis for the rows of ``frame`` (None without a scale axis)."""
    return dict(zip(frame["config"], frame[d.size_key])) if d.size_key else None


def seed_statistics(d: ReportData, labels: list[str]) -> pd.DataFrame:
    """compare_with_best over the groups of ``d.runs["config"]``, in the order of ``labels``."""
    m = metric(d.metric)
    groups = dict(list(d.runs.groupby("config", sort=False)))
    samples = {label: _by_seed(groups[label], m.source) if label in groups else [] for label in labels}
    sizes = _sizes(d, d.agg) if d.size_key else None
    return compare_with_best(samples, m, sizes)


def scores(runs: pd.DataFrame, m: Metric) -> pd.Series:
    """Each run's score under the metric ``m``, the one rule by which a best value is chosen.

    A completed run scores its metric. For a loss, a run that diverged scores the loss at
    initialisation (it learned nothing; the gap to the floor at init for ``floor_gap``). A failed run,
    a metric without a value at init (a throughput) for a diverged one, or a run without a step-0
    evaluation, scores NaN: it counts for nothing.
    """
    value = _completed(runs, m)
    if not m.loss:
        return value
    return value.where(~runs["status"].eq("diverged"), _init(runs, m))


def readings(runs: pd.DataFrame, m: Metric) -> pd.Series:
    """Each run's value under the metric ``m`` where the seeds of one configuration at one value are
    compared: the one rule by which the report and a claim read them (the module's docstring says why).

    A completed run reads its metric. For a loss, a run that diverged is ranked worst: it reads the
    worst value of the completed runs among ``runs``, or where none completed its loss at
    initialisation. A failed run, and for a metric without a value at init a diverged one, reads
    NaN: it counts for nothing.
    """
    value = _completed(runs, m)
    if not m.loss:
        return value
    worst = value.max()
    worst = worst if math.isfinite(worst) else _init(runs, m)
    return value.where(~runs["status"].eq("diverged"), worst)


def _completed(runs: pd.DataFrame, m: Metric) -> pd.Series:
    """The metric of each completed run, NaN for any other."""
    return pd.to_numeric(runs[m.source], errors="coerce").where(runs["status"].eq("completed"))


def _init(runs: pd.DataFrame, m: Metric) -> pd.Series:
    """Each run's metric at step 0 (NaN without a step-0 evaluation)."""
    if "init_val_loss" not in runs:
        return pd.Series(math.nan, index=runs.index)
    init = pd.to_numeric(runs["init_val_loss"], errors="coerce")
    if m.source == "floor_gap":
        init = init - pd.to_numeric(runs["floor_loss"], errors="coerce")
    return init


def failed_note(runs: pd.DataFrame, rerun: str) -> str:
    """'2 runs failed (not counted): re-run them with RERUN' for the failed runs among ``runs``."""
    failed = int(runs["status"].eq("failed").sum())
    if not failed:
        return ""
    return f"{failed} run{'s' if failed > 1 else ''} failed (not counted): re-run them with {rerun}"


def _best(means: pd.Series, higher_is_better: bool) -> float:
    """The value of the tuned key with the best mean (NaN when none has one)."""
    if not means.notna().any():
        return math.nan
    return means.idxmax() if higher_is_better else means.idxmin()


def at_best_value(
    runs: pd.DataFrame, key: str, scores: pd.Series, higher_is_better: bool = False
) -> tuple[pd.Index, float]:
    """(the runs of one configuration at its best value of ``key``, that best value).

    The best value is the one whose runs have the best mean of ``scores`` (a Series over ``runs``;
    NaN scores count for nothing): the lowest, or the highest where higher is better; NaN when no
    value has a score. Every seed is read at that one value.
    """
    values = pd.to_numeric(runs[key], errors="coerce")
    best = _best(scores.groupby(values).mean(), higher_is_better)
    return runs.index[values.eq(best)], best


def _at_init(group: pd.DataFrame, m: Metric) -> float:
    """The metric at step 0 (the same init for every value of the tuned key), for a loss only."""
    return _init(group, m).mean() if m.loss else math.nan


def _config_groups(d: ReportData, runs: pd.DataFrame, tune_key: str):
    """(label, group keys' values, runs) per configuration: the group keys without ``tune_key``."""
    keys = [k for k in (d.keys or default_group_keys(ran(d.runs), d.config_keys)) if k != tune_key]
    groups = runs.groupby(keys, dropna=False, sort=False) if keys else [((), runs)]
    for values, group in groups:
        values = values if isinstance(values, tuple) else (values,)
        yield config_label(keys, values) or "all runs", dict(zip(keys, values)), group


def _fmt_grid(values) -> str:
    return " ".join(f"{v:g}" for v in values)


def tune(d: ReportData, tune_key: str, warn) -> pd.DataFrame:
    """tuned.csv: one row per configuration, best first (within each size, with a scale axis)."""
    m = metric(d.metric)
    mean_col = f"{m.source}_mean"
    runs = d.runs.assign(_value=pd.to_numeric(d.runs[tune_key], errors="coerce"))
    rows, samples, no_init = [], {}, []
    for label, key_values, group in _config_groups(d, runs, tune_key):
        grid = sorted(group["_value"].dropna().unique())
        done = group["status"].eq("completed") & group[m.source].notna()
        score = scores(group, m)
        means = score.groupby(group["_value"]).mean().reindex(grid)
        scored = score.notna().groupby(group["_value"]).sum().reindex(grid, fill_value=0)
        chosen, best = at_best_value(group, tune_key, score, m.higher_is_better)
        at_init = _at_init(group, m)
        if len(grid) < 2 or not m.loss:
            sensitivity = math.nan  # 0 by definition over one value; without a value at init, undefined
        elif math.isfinite(at_init):
            # per seed: min(value, value at init), a diverged seed counting as the value at init; a
            # failed one left out
            diverged = group["status"].eq("diverged")
            capped = group[m.source].where(done, at_init).where(done | diverged).clip(upper=at_init)
            per_value = capped.groupby(group["_value"]).mean().reindex(grid)
            sensitivity = float((per_value - per_value.min()).mean())
        else:
            sensitivity = math.nan
            no_init.append(label)
        status = group.groupby("_value")["status"]
        all_done = status.agg(lambda s: s.eq("completed").all())
        diverged = status.agg(lambda s: int(s.eq("diverged").sum()))
        failed = status.agg(lambda s: int(s.eq("failed").sum()))
        size = status.size()
        at_best = group.loc[chosen]
        samples[label] = _by_seed(at_best.assign(_score=readings(at_best, m)), "_score", completed=False)
        final = at_best.loc[at_best["status"].eq("completed"), "final_val_loss"]
        rows.append(
            {
                "config": label,
                **key_values,
                "tune_key": tune_key,
                "metric": m.name,
                "best_value": best,
                mean_col: means.get(best, math.nan) if pd.notna(best) else math.nan,
                # the charts draw the final loss at each configuration's best value, whatever the metric
                **({"final_val_loss_mean": final.mean()} if mean_col != "final_val_loss_mean" else {}),
                "n_seeds": len(_values(samples[label])),
                # the most seeds any value has: a best value on fewer rests on less evidence
                "n_seeds_most": int(scored.max()) if len(grid) else 0,
                "loss_init": at_init,
                "lr_sensitivity": sensitivity,
                "grid": _fmt_grid(grid),
                "values": len(grid),
                "values_completed": int(all_done.sum()),
                "values_diverged": int((diverged > 0).sum()),
                "values_failed": int((failed > 0).sum()),
                "diverged_at": "; ".join(f"{v:g} ({diverged[v]}/{size[v]})" for v in grid if diverged[v]),
                "failed_at": "; ".join(f"{v:g} ({failed[v]}/{size[v]})" for v in grid if failed[v]),
            }
        )
    if no_init:
        warn(
            f"LR sensitivity left empty for {', '.join(no_init)}: no step-0 evaluation in metrics.jsonl "
            "(runs from an older normbench)"
        )
    tuned = pd.DataFrame(rows).set_index("config")
    tuned = tuned.join(compare_with_best(samples, m, _sizes(d, tuned.reset_index())))
    tuned = tuned.sort_values(
        mean_col, ascending=not m.higher_is_better, na_position="last", kind="stable"
    ).reset_index()
    return tuned


def aggregate_statistics(d: ReportData) -> pd.DataFrame:
    """STAT_COLUMNS for the rows of ``d.agg``: each row's interval, and its comparison with the best row.

    When tuning, a configuration is compared at its best value only: that row's comparison is
    the one in tuned.csv, and the configuration's other rows have none.
    """
    stats = seed_statistics(d, list(d.agg["config"])).reset_index(drop=True)
    if d.tune:
        keys = [k for k in d.keys if k != d.tune]
        tuned = d.tuned.set_index("config")
        compared = list(STAT_COLUMNS[3:])
        for i, row in d.agg.iterrows():
            config = config_label(keys, [row[k] for k in keys]) or "all runs"
            at_best = pd.to_numeric(row[d.tune], errors="coerce") == tuned.at[config, "best_value"]
            stats.loc[i, compared] = tuned.loc[config, compared].to_numpy() if at_best else None
    return stats


def tuned_configs(d: ReportData) -> pd.Series:
    """Each run's configuration as tuned.csv names it: its label without the tuning key."""
    keys = [k for k in d.keys if k != d.tune]
    labels = [config_label(keys, v) for v in d.runs[keys].itertuples(index=False)] if keys else "all runs"
    return pd.Series(labels, index=d.runs.index)


def at_best(d: ReportData, frame: pd.DataFrame) -> pd.DataFrame:
    """With a tuned key, each configuration's runs at its best value only: one line per
    configuration rather than one per value of the grid."""
    if d.tune is None or d.tuned is None:
        return frame
    best = tuned_configs(d).map(d.tuned.set_index("config")["best_value"])
    runs = d.runs.index[pd.to_numeric(d.runs[d.tune], errors="coerce").eq(best)]
    return frame[frame["run"].isin(runs)]

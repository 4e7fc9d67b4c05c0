"""The tuning axis: each configuration at its best value of one key (the learning rate), its LR
sensitivity, and how the configurations compare with the best one over seeds.

A *configuration* is a combination of the group keys without the tuning key. For each one:

- its best value: the value whose completed seeds have the lowest mean final validation loss;
- its LR sensitivity, as Wortsman et al. (2023, "Small-scale proxies for large-scale Transformer
  training instabilities", §2.2) define it: the mean over the swept values η of
  ``min(loss(η), loss_init) - loss*``, where ``loss(η)`` is the mean final validation loss over
  the seeds at η, ``loss_init`` the validation loss at step 0 and ``loss*`` the lowest
  ``loss(η)``. A seed that diverged or failed at η counts as ``loss_init`` (it learned nothing),
  and the min is taken per seed, before the mean. It depends on the grid: sensitivities over
  different grids are not comparable;
- the seed statistics of normbench.report.stats at its best value: the mean's 95% interval, and
  the difference to the best configuration with its interval and p-value.

The same comparison without a tuning key (``seed_statistics``) fills aggregate.csv.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from normbench.core.errors import ConfigError
from normbench.report.load import ReportData
from normbench.report.stats import NEEDS_SEEDS, compare, mean_ci
from normbench.report.tables import config_label, default_group_keys, varying_keys

METRIC = "final_val_loss"  # the statistics, the tuning and the sensitivity are all about it
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
        return "train.lr" if "train.lr" in varying else None
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


def _by_seed(runs: pd.DataFrame) -> dict | list:
    """Completed final losses as {seed: loss} when the seeds are distinct, else a plain list."""
    done = runs[runs["status"].eq("completed") & runs[METRIC].notna()]
    seeds = done["seed"].tolist()
    if len(set(seeds)) == len(seeds) and not done["seed"].isna().any():
        return dict(zip(seeds, done[METRIC]))
    return done[METRIC].tolist()


def _values(sample) -> list:
    return list(sample.values()) if isinstance(sample, dict) else list(sample)


def compare_with_best(samples: dict) -> pd.DataFrame:
    """Per label: the mean's 95% interval and the comparison with the label of lowest mean.

    ``samples`` maps a label to {seed: loss} (or a list of losses), in display order.
    """
    means = {label: np.mean(_values(s)) if _values(s) else math.nan for label, s in samples.items()}
    finite = {k: v for k, v in means.items() if math.isfinite(v)}
    best = min(finite, key=finite.get) if finite else None
    rows = []
    for label, sample in samples.items():
        ci = mean_ci(_values(sample))
        row = {
            "ci_low": ci.low if ci else math.nan,
            "ci_high": ci.high if ci else math.nan,
            "ci_method": ci.method if ci else (NEEDS_SEEDS if _values(sample) else "no completed run"),
        }
        if label == best:
            row.update(diff_vs_best=0.0, vs_best="best")
        elif not math.isfinite(means[label]) or best is None:
            row.update(vs_best="no completed run")
        else:
            c = compare(sample, samples[best])
            row.update(
                diff_vs_best=c.diff,
                diff_ci_low=c.ci.low if c.ci else math.nan,
                diff_ci_high=c.ci.high if c.ci else math.nan,
                p_value=c.p,
                test=c.method,
                vs_best=NEEDS_SEEDS
                if c.ci is None
                else ("tied" if c.tied else ("worse" if c.ci.low > 0 else "better")),
            )
        rows.append(row)
    return pd.DataFrame(rows, index=list(samples), columns=list(STAT_COLUMNS))


def seed_statistics(runs: pd.DataFrame, labels: list[str]) -> pd.DataFrame:
    """compare_with_best over the groups of ``runs["config"]``, in the order of ``labels``."""
    groups = dict(list(runs.groupby("config", sort=False)))
    return compare_with_best({label: _by_seed(groups[label]) if label in groups else [] for label in labels})


def _fmt_grid(values) -> str:
    return " ".join(f"{v:g}" for v in values)


def tune(d: ReportData, tune_key: str, warn) -> pd.DataFrame:
    """tuned.csv: one row per configuration, best first."""
    keys = [k for k in d.keys if k != tune_key]
    runs = d.runs.assign(_value=pd.to_numeric(d.runs[tune_key], errors="coerce"))
    groups = runs.groupby(keys, dropna=False, sort=False) if keys else [((), runs)]
    rows, samples, no_init = [], {}, []
    for values, group in groups:
        values = values if isinstance(values, tuple) else (values,)
        label = config_label(keys, values) or "all runs"
        grid = sorted(group["_value"].dropna().unique())
        done = group["status"].eq("completed") & group[METRIC].notna()
        means = group[done].groupby("_value")[METRIC].mean().reindex(grid)
        best = means.idxmin() if means.notna().any() else math.nan
        loss_init = group["init_val_loss"].mean()  # independent of the value: the same init for every η
        if len(grid) < 2:
            sensitivity = math.nan  # 0 by definition over one value, which says nothing
        elif math.isfinite(loss_init):
            # per seed: min(loss, loss_init), a diverged or failed seed counting as loss_init
            capped = group[METRIC].where(done, loss_init).clip(upper=loss_init)
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
        at_best = group[group["_value"].eq(best)]
        samples[label] = _by_seed(at_best)
        rows.append(
            {
                "config": label,
                **dict(zip(keys, values)),
                "tune_key": tune_key,
                "best_value": best,
                f"{METRIC}_mean": means.min() if means.notna().any() else math.nan,
                "n_seeds": len(_values(samples[label])),
                "loss_init": loss_init,
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
    tuned = tuned.join(compare_with_best(samples))
    tuned = tuned.sort_values(f"{METRIC}_mean", na_position="last", kind="stable").reset_index()
    return tuned


def aggregate_statistics(d: ReportData) -> pd.DataFrame:
    """STAT_COLUMNS for the rows of ``d.agg``: each row's interval, and its comparison with the best row.

    When tuning, a configuration is compared at its best value only: that row's comparison is
    the one in tuned.csv, and the configuration's other rows have none.
    """
    stats = seed_statistics(d.runs, list(d.agg["config"])).reset_index(drop=True)
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

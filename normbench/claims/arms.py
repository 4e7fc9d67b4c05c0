"""A claim's arms: the runs each side compares, each seed at the arm's tuned value, read as samples.

Each arm is the runs whose config matches the claim's ``compare.a`` (``b``). With a tuning key
(``compare.tune``, the learning rate) every seed of the arm is read at the arm's one best value: the
lowest mean final validation loss over all its seeds, scored as ``normbench report`` scores them
(normbench.report.tuning.scores: a diverged seed at its loss at initialisation) and its seeds read
there as the report reads them (normbench.report.tuning.readings): the report and a claim read the
same runs one way. Where the metric is a loss, a seed that diverged at the arm's value is ranked
worst: it reads the worst loss a completed seed of its arm reached there (a worst-rank score:
evidence the arm is worse, bounded by what the arm's own seeds reached, so one divergence cannot
turn an effect every seed shows into a spread that decides nothing). A run that failed (crashed) is
an error, not a result: it is left out, and the verdict says how many were. An arm whose best value
is the grid's smallest or largest may do better still off the grid: its verdict is inconclusive
until the grid is extended.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from normbench.report.metrics import metric
from normbench.report.tuning import at_best_value, readings, scores

TUNED_ON = "final_val_loss"  # what the tuning value is chosen by, whatever the claim's metric
LOSSES = ("final_val_loss", "best_val_loss")  # metrics a diverged run is ranked worst for


def matches(column: pd.Series, value) -> pd.Series:
    """Config values equal to a YAML value: numbers numerically (0 and 0.0), booleans and text as text."""
    if isinstance(value, bool):
        return column.astype(str).str.lower().eq(str(value).lower())
    if isinstance(value, (int, float)):
        return pd.to_numeric(column, errors="coerce").sub(value).abs().le(1e-12 * max(1.0, abs(value)))
    return column.astype(str).eq(str(value))


def arm(runs: pd.DataFrame, spec: dict) -> pd.DataFrame:
    """The runs whose config has every key: value of ``spec`` (none when a key is not in the runs)."""
    mask = pd.Series(True, index=runs.index)
    for key, value in spec.items():
        mask &= matches(runs[key], value) if key in runs else False
    return runs[mask]


def learned(runs: pd.DataFrame) -> pd.Series:
    """Each run's final validation loss as the report scores it for choosing a best value (a run that
    diverged at its loss at init; a failed one NaN): report and claims choose by one rule."""
    return scores(runs, metric(TUNED_ON))


def grid(runs: pd.DataFrame, key: str | None) -> list[float]:
    """The values ``key`` takes among the runs, sorted (none without a key)."""
    if key is None or key not in runs:
        return []
    return sorted(pd.to_numeric(runs[key], errors="coerce").dropna().unique())


def at_best(runs: pd.DataFrame, key: str | None, side: str = "a") -> tuple[pd.DataFrame, str | None]:
    """(the arm's runs at its best value of ``key``, every seed there; a note when that value is at the
    grid's edge). Every run counts without a key or with one value."""
    values = grid(runs, key)
    if len(values) < 2:
        return runs, None
    chosen, best = at_best_value(runs, key, learned(runs))
    edge = None
    if best in (values[0], values[-1]):
        end = "smallest" if best == values[0] else "largest"
        edge = f"{side}'s best {key} ({best:g}) is the grid's {end}: extend the grid past it"
    return runs.loc[chosen], edge


def samples(runs: pd.DataFrame, name: str, log: bool = False) -> dict:
    """{seed: metric ``name``} (its natural log with ``log``) over the runs with a finite value (and a
    positive one with ``log``). For a loss, the runs (an arm at one value) are read as the report reads
    its seeds (``readings``): completed runs at their value, a diverged one tied with the worst
    completed; a failed run is left out."""
    if name not in runs:
        return {}
    if name in LOSSES:
        values = readings(runs, metric(name))
    else:
        values = pd.to_numeric(runs[name], errors="coerce").where(runs["status"].eq("completed"))
    if log:
        values = np.log(values.where(values > 0))
    kept = runs[np.isfinite(values)]
    return dict(zip(kept["seed"], values[kept.index]))


def per_seed_best(runs: pd.DataFrame, key: str) -> dict:
    """{seed: log2 of the value of ``key`` with the seed's lowest final loss} (diverged: loss at init)."""
    best = {seed: at_best_value(seeds, key, learned(seeds))[1] for seed, seeds in runs.groupby("seed")}
    return {seed: np.log2(value) for seed, value in best.items() if not np.isnan(value)}


def log2_step(runs: pd.DataFrame, key: str | None) -> float:
    """The grid's step in log2 (its smallest gap): the resolution of a value read off it."""
    positive = [v for v in grid(runs, key) if v > 0]
    return float(np.min(np.diff(np.log2(positive)))) if len(positive) >= 2 else 0.0

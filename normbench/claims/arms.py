"""A claim's arms: the runs each side compares, each seed at its tuning value, read as samples.

Each arm is the runs whose config matches the claim's ``compare.a`` (``b``). With a
tuning key (``compare.tune``, the learning rate) each seed is read at the value chosen on the
arm's *other* seeds (leave one seed out: the lowest mean final validation loss among them, a
diverged or failed run counting as its loss at initialisation). Choosing on the seeds an arm is
then compared on flatters the arm whose seeds scatter more; choosing on the others does not. An
arm whose best value (over all its seeds) is the grid's smallest or largest may do better still
off the grid: its verdict is inconclusive until the grid is extended. A run that diverged is
read at its initialisation loss (it learned nothing) where the metric is a loss.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from normbench.report.metrics import metric
from normbench.report.tuning import at_best_value, scores

TUNED_ON = "final_val_loss"  # what the tuning value is chosen by, whatever the claim's metric
LOSSES = ("final_val_loss", "best_val_loss")  # metrics a diverged run is read at its init loss for


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
    """Each run's final validation loss as the report scores it for choosing a best value (a run
    that diverged or failed at its loss at init): report and claims choose by one rule."""
    return scores(runs, metric(TUNED_ON))


def grid(runs: pd.DataFrame, key: str | None) -> list[float]:
    """The values ``key`` takes among the runs, sorted (none without a key)."""
    if key is None or key not in runs:
        return []
    return sorted(pd.to_numeric(runs[key], errors="coerce").dropna().unique())


def at_best(runs: pd.DataFrame, key: str | None, side: str = "a") -> tuple[pd.DataFrame, str | None]:
    """(the arm's runs, each seed at the value of ``key`` chosen on the arm's other seeds; a note when
    the arm's best value is at the grid's edge). Every run counts without a key or with one value."""
    values = grid(runs, key)
    if len(values) < 2:
        return runs, None
    chosen, best = at_best_value(runs, key, learned(runs), held_out=True)
    edge = None
    if best in (values[0], values[-1]):
        end = "smallest" if best == values[0] else "largest"
        edge = f"{side}'s best {key} ({best:g}) is the grid's {end}: extend the grid past it"
    return runs.loc[chosen], edge


def samples(runs: pd.DataFrame, metric: str, log: bool = False) -> dict:
    """{seed: metric} (its natural log with ``log``) over the runs with a finite value (and a positive
    one with ``log``): completed runs, and for a loss also the diverged ones, at their loss at init."""
    if metric not in runs:
        return {}
    values = pd.to_numeric(runs[metric], errors="coerce")
    done = runs["status"].eq("completed")
    if metric in LOSSES:
        values = values.where(done, pd.to_numeric(runs["init_val_loss"], errors="coerce"))
        done = done | runs["status"].eq("diverged")
    if log:
        values = np.log(values.where(values > 0))
    kept = runs[done & np.isfinite(values)]
    return dict(zip(kept["seed"], values[kept.index]))


def per_seed_best(runs: pd.DataFrame, key: str) -> dict:
    """{seed: log2 of the value of ``key`` with the seed's lowest final loss} (diverged: loss at init)."""
    best = {seed: at_best_value(seeds, key, learned(seeds))[1] for seed, seeds in runs.groupby("seed")}
    return {seed: np.log2(value) for seed, value in best.items() if not np.isnan(value)}


def log2_step(runs: pd.DataFrame, key: str | None) -> float:
    """The grid's step in log2 (its smallest gap): the resolution of a value read off it."""
    positive = [v for v in grid(runs, key) if v > 0]
    return float(np.min(np.diff(np.log2(positive)))) if len(positive) >= 2 else 0.0

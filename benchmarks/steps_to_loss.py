"""Steps to the same loss: does configuration A reach a validation loss in fewer steps than B?

    python benchmarks/steps_to_loss.py SWEEP_DIR --a placement.name=ngpt --b norm.name=ln,placement.name=pre

nGPT's claim (Loshchilov et al. 2024: 4 to 20 times fewer steps to the same loss) is of this kind.
Each side is taken at its own best value of --tune (default train.lr): the lowest mean final
validation loss over its completed seeds. The target is the loss every one of those runs reaches:
the highest of their lowest validation losses. Per seed, the steps to it are the first evaluated
step at which the validation loss is at or below it (so the resolution is train.eval_every).
Prints each side's steps (mean, 95% t interval over seeds), their ratio, and the paired
difference by seed with its interval (normbench.report.stats.compare).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from normbench.report.load import find_inputs, load_runs
from normbench.report.stats import compare, mean_ci


def side(runs: pd.DataFrame, spec: str) -> pd.DataFrame:
    """The runs whose config matches every KEY=VALUE of ``spec`` (comma-separated)."""
    mask = pd.Series(True, index=runs.index)
    for item in spec.split(","):
        key, value = item.split("=", 1)
        if key not in runs:
            raise SystemExit(f"error: no config key {key} in these runs")
        mask &= runs[key].astype(str).eq(value)
    if not mask.any():
        raise SystemExit(f"error: no run matches {spec}")
    return runs[mask]


def at_best(runs: pd.DataFrame, tune: str) -> tuple[float, pd.DataFrame]:
    done = runs[runs["status"].eq("completed")]
    means = done.groupby(tune)["final_val_loss"].mean()
    best = means.idxmin()
    return best, done[done[tune].eq(best)]


def steps_to(evals: pd.DataFrame, run: int, target: float) -> float:
    curve = evals[evals["run"].eq(run)].sort_values("step")
    reached = curve[curve["val_loss"] <= target]
    return float(reached["step"].iloc[0]) if len(reached) else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--a", required=True, help="KEY=VALUE[,KEY=VALUE]: the configuration under test")
    parser.add_argument("--b", required=True, help="KEY=VALUE[,KEY=VALUE]: the one it is compared with")
    parser.add_argument("--tune", default="train.lr")
    args = parser.parse_args()
    run_dirs, _ = find_inputs(args.paths)
    data = load_runs(run_dirs, warn=lambda message: None)
    runs = data.runs.reset_index(drop=True).assign(run=lambda r: r.index)
    sides = {name: at_best(side(runs, spec), args.tune) for name, spec in (("A", args.a), ("B", args.b))}
    chosen = pd.concat([part for _, part in sides.values()])["run"]
    target = data.evals[data.evals["run"].isin(chosen)].groupby("run")["val_loss"].min().max()
    steps = {}
    for name, (best, part) in sides.items():
        steps[name] = {int(row.seed): steps_to(data.evals, row.run, target) for row in part.itertuples()}
        spec = args.a if name == "A" else args.b
        missed = sorted(seed for seed, s in steps[name].items() if math.isnan(s))
        reached = [s for s in steps[name].values() if not math.isnan(s)]
        ci = mean_ci(reached)
        mean = sum(reached) / len(reached) if reached else math.nan
        print(
            f"{name} {spec} at {args.tune}={best:g}: final loss {part['final_val_loss'].mean():.4f} over "
            f"{len(part)} seeds; steps to {target:.4f}: {mean:.0f}"
            + (f" [{ci.low:.0f}, {ci.high:.0f}]" if ci else "")
            + (f"; seeds {missed} never reach it" if missed else "")
        )
    a = {seed: s for seed, s in steps["A"].items() if not math.isnan(s)}
    b = {seed: s for seed, s in steps["B"].items() if not math.isnan(s)}
    diff = compare(a, b)
    ratio = (sum(a.values()) / len(a)) / (sum(b.values()) / len(b)) if a and b else math.nan
    interval = (
        f" [{diff.ci.low:+.0f}, {diff.ci.high:+.0f}] ({'paired by seed' if diff.paired else 'Welch'})"
        if diff.ci
        else ""
    )
    print(f"A - B: {diff.diff:+.0f} steps{interval}; A needs {ratio:.2f}x B's steps to reach {target:.4f}")


if __name__ == "__main__":
    main()

"""How often the 95% intervals of ``normbench report --predict`` and of a claim's trend predicate cover
the truth, on planted laws with seed noise.

    python benchmarks/interval_coverage.py [--draws 400] [--seeds 3]

Each draw plants per-seed final losses from known laws (L = E + A N^-alpha per configuration for the
prediction; a gap linear in log2 of the size for the trend), with a noise every configuration of a
seed shares (the same data order and init) and one of its own, then builds the interval as the
report and the claims do (``normbench.report.predict.predict``; ``normbench.report.stats.compare``
per size, then ``normbench.report.stats.fit_trend``) and counts whether the truth lies inside.
A coverage estimated from D draws has a binomial standard error of about sqrt(0.05 * 0.95 / D):
1.1 points at 400 draws. For the prediction it also counts the draws whose fit the lack-of-fit test
rejects (read "no prediction" in a report): on a true law, the test's false alarms.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from rich.console import Console
from rich.table import Table

from normbench.report.predict import NO_PREDICTION, predict
from normbench.report.stats import compare, fit_trend


def law(E: float, A: float, alpha: float):
    return lambda n: E + A * np.asarray(n, float) ** -alpha


def gpt_params(widths) -> dict:
    return {w: 12 * 2 * w * w + 64 * w for w in widths}


# (name, baseline law, other law, the noise shared by a seed's configurations, each one's own)
PREDICT_CASES = (
    ("two laws, shared seed noise", law(2.0, 40.0, 0.35), law(2.1, 60.0, 0.4), 0.01, 0.002),
    ("crossing laws, own noise only", law(2.0, 40.0, 0.35), law(1.9, 60.0, 0.35), 0.0, 0.005),
)


def plant(rng, laws: dict, x: dict, seeds: int, shared: float, own: float) -> dict:
    samples = {}
    for size, n in x.items():
        common = rng.normal(0, shared, seeds)
        for name, truth in laws.items():
            samples[(name, size)] = {
                k: float(truth(n)) + common[k] + rng.normal(0, own) for k in range(seeds)
            }
    return samples


def predict_coverage(draws: int, seeds: int) -> list[tuple[str, float]]:
    x = gpt_params((16, 24, 32, 48, 64))
    sizes, largest = list(x), max(x.values())
    targets = [2 * largest, 4 * largest]
    rows = []
    for name, ln, rms, shared, own in PREDICT_CASES:
        hits, counted, withheld = np.zeros((2, 2)), np.zeros((2, 2)), 0
        for draw in range(draws):
            rng = np.random.default_rng(1000 + draw)
            samples = plant(rng, {"ln": ln, "rms": rms}, x, seeds, shared, own)
            r = predict(samples, ["ln", "rms"], "ln", sizes, x, targets)
            r = r[r["config"].eq("rms")].reset_index()
            withheld += r.at[0, "verdict"] == NO_PREDICTION
            for t, target in enumerate(targets):
                for k, (low, high, truth) in enumerate(
                    (
                        (r.at[t, "loss_ci_low"], r.at[t, "loss_ci_high"], rms(target)),
                        (r.at[t, "gap_ci_low"], r.at[t, "gap_ci_high"], rms(target) - ln(target)),
                    )
                ):
                    if math.isfinite(low):
                        counted[k, t] += 1
                        hits[k, t] += low <= truth <= high
        for k, what in enumerate(("loss", "gap")):
            for t, times in enumerate((2, 4)):
                rows.append(
                    (
                        f"predict {what} at {times}x the largest size: {name}",
                        hits[k, t],
                        counted[k, t],
                        f"{100 * withheld / draws:.1f}%",
                    )
                )
    return rows


def trend_coverage(draws: int, seeds: int) -> list[tuple[str, float]]:
    sizes = np.array([32.0, 64.0, 128.0, 256.0, 512.0])
    rows = []
    for name, slope, shared, own in (
        ("a gap that grows, shared seed noise", 0.01, 0.02, 0.005),
        ("no trend, own noise only", 0.0, 0.0, 0.01),
    ):
        hits = counted = 0
        for draw in range(draws):
            rng = np.random.default_rng(2000 + draw)
            gaps, ses, dfs = [], [], []
            for size in sizes:
                common = rng.normal(0, shared, seeds)
                truth = 0.02 + slope * math.log2(size / sizes[0])
                a = {k: 3.0 + truth + common[k] + rng.normal(0, own) for k in range(seeds)}
                b = {k: 3.0 + common[k] + rng.normal(0, own) for k in range(seeds)}
                c = compare(a, b)
                gaps.append(c.diff), ses.append(c.se), dfs.append(c.df)
            fit = fit_trend(sizes, gaps, ses, dfs)
            counted += 1
            hits += fit.low <= slope <= fit.high
        rows.append((f"trend slope per doubling: {name}", hits, counted, "-"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=400)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    table = Table(
        title=f"coverage of nominal 95% intervals, {args.draws} planted draws, {args.seeds} seeds, 5 sizes"
    )
    for column in ("interval", "covered", "draws with an interval", "withheld: misfit"):
        table.add_column(column, justify="left" if column == "interval" else "right")
    for label, hits, counted, withheld in [
        *predict_coverage(args.draws, args.seeds),
        *trend_coverage(args.draws, args.seeds),
    ]:
        table.add_row(label, f"{100 * hits / counted:.1f}%" if counted else "-", f"{int(counted)}", withheld)
    Console().print(table)


if __name__ == "__main__":
    main()

"""The small-sample statistics of the claims' verdicts: t intervals and tests at a family level,
the exact sign-flip (or permutation) test, a grid's resolution as a floor under a spread, and the
seeds that would settle an interval too wide.

Seeds are compared with normbench.report.stats.compare (paired by seed when both
arms ran the same seeds, Welch otherwise): t intervals. Where the seeds show no spread at all a t
interval has width 0 and says nothing; the verdict is then the exact sign-flip (or, unpaired,
permutation) test's, whose smallest p with n pairs is 2 / 2^n: three identical differences cannot
read "reproduced". Grid-valued and step-valued outcomes (a best or largest stable learning rate, a
step count at an evaluation) are discrete: their spread is floored at the grid's resolution
(a value read on a grid of step h carries h / sqrt(12) of rounding), and the exact test must agree
with the interval.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
from scipy import stats

from normbench.report.stats import CONFIDENCE, Comparison

ALPHA = 1 - CONFIDENCE
POWER = 0.8  # the power a suggested seed count is for
MAX_SEEDS = 1000  # beyond this, "no seed count settles it"
EXACT_UP_TO = 14  # pairs (2^14 sign flips) enumerated exactly; beyond, a fixed sample of them


def interval(c: Comparison, alpha: float) -> tuple[float, float]:
    """c's t interval at confidence 1 - alpha (NaN where there is no spread to build one from)."""
    if math.isclose(alpha, ALPHA) and c.ci is not None and c.se > 0:
        return c.ci.low, c.ci.high
    if not c.se > 0:
        return math.nan, math.nan
    half = float(stats.t.ppf(1 - alpha / 2, c.df) * c.se)
    return c.diff - half, c.diff + half


def t_p(diff: float, se: float, df: float) -> float:
    """Two-sided p of diff against 0 with standard error se (1 without spread: see exact_p)."""
    if not se > 0:
        return 1.0
    return float(2 * stats.t.sf(abs(diff) / se, df))


def tost_p(diff: float, se: float, df: float, delta: float) -> float:
    """Two one-sided tests of |diff| < delta: the larger of the two one-sided p-values."""
    if not se > 0:
        return 1.0
    return float(max(stats.t.sf((diff + delta) / se, df), stats.t.cdf((diff - delta) / se, df)))


def outside_p(diff: float, se: float, df: float, delta: float) -> float:
    """The one-sided test that the difference lies beyond ±delta (on the side of its estimate)."""
    if not se > 0:
        return 1.0
    return float(min(stats.t.sf((diff - delta) / se, df), stats.t.cdf((diff + delta) / se, df)))


def exact_p(a: dict, b: dict, shift: float = 0.0, side: int = 0) -> float:
    """The exact test of mean(a) - mean(b) against ``shift``, valid for few seeds and ties: the sign-flip
    test of the per-seed differences when both arms ran the same seeds, the permutation test of the
    arm labels otherwise. ``side``: 0 two-sided, +1 (a - b > shift), -1 (a - b < shift)."""
    if set(a) == set(b) and len(a) >= 1:
        d = np.array([a[s] - b[s] for s in sorted(a)], float) - shift
        if len(d) <= EXACT_UP_TO:
            flips = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))
        else:  # 2^n is too many: a fixed random sample of the sign flips
            flips = np.random.default_rng(0).choice((1.0, -1.0), size=(2**EXACT_UP_TO, len(d)))
        stats_ = flips @ d / len(d)
        observed = d.mean()
    else:
        xa, xb = np.array(list(a.values()), float) - shift, np.array(list(b.values()), float)
        pooled, n = np.concatenate([xa, xb]), len(xa)
        if math.comb(len(pooled), n) <= 2**EXACT_UP_TO:
            picks = [list(i) for i in itertools.combinations(range(len(pooled)), n)]
        else:  # a fixed random sample of the relabellings
            rng = np.random.default_rng(0)
            picks = [list(rng.permutation(len(pooled))[:n]) for _ in range(2**EXACT_UP_TO)]
        stats_ = np.array([pooled[i].mean() - np.delete(pooled, i).mean() for i in picks])
        observed = xa.mean() - xb.mean()
    tol = 1e-12 * max(1.0, abs(observed))
    if side == 0:
        return float(np.mean(np.abs(stats_) >= abs(observed) - tol))
    return float(np.mean(side * stats_ >= side * observed - tol))


def floored(c: Comparison, n: int, resolution: float) -> Comparison:
    """c with its standard error at least that of a difference of two values rounded to a grid of step
    ``resolution`` (each carries resolution / sqrt(12), the difference sqrt(2) times that)."""
    floor = resolution / math.sqrt(6) / math.sqrt(max(n, 1))
    if not resolution > 0 or c.se >= floor:
        return c
    df = c.df if math.isfinite(c.df) and c.df > 0 else max(n - 1.0, 1.0)
    return dataclasses.replace(c, se=floor, df=df, ci=None)


def power(n: int, effect: float, alpha: float, sides: int = 2) -> float:
    """The power of a t test on n paired differences at level alpha for a true mean ``effect`` (in
    units of the differences' spread): the noncentral t's mass beyond the critical value."""
    df, nc = n - 1, effect * math.sqrt(n)
    crit = stats.t.ppf(1 - alpha / sides, df)
    return float(stats.nct.sf(crit, df, nc) + (stats.nct.cdf(-crit, df, nc) if sides == 2 else 0.0))


def seeds_needed(sd: float, margin: float, alpha: float, sides: int = 2) -> str:
    """'about N seeds per arm would settle it': the fewest seeds at which a t test at level alpha
    (``sides`` 2: two-sided; 1: one-sided, as each of two one-sided tests) has 80% power for an
    effect of ``margin`` at the measured spread ``sd`` of a seed's difference."""
    if not margin > 0 or not math.isfinite(sd):
        return "no seed count settles it at this estimate"
    if sd == 0:
        return "no spread between the seeds: more seeds, so that an exact test can reach its level"
    for n in range(2, MAX_SEEDS):
        if power(n, margin / sd, alpha, sides) >= POWER:
            return f"about {n} seeds per arm would settle it with 80% power (spread {sd:.3g})"
    return f"more than {MAX_SEEDS} seeds per arm would be needed (spread {sd:.3g})"


def seed_sd(c: Comparison, n: int) -> float:
    """A seed's standard deviation behind c's standard error over n seeds (0 without spread)."""
    return c.se * math.sqrt(n) if c.se > 0 else 0.0


def exact_floor(p: float, n: int, alpha: float) -> str:
    """'the exact test's p is 0.25 (at least 0.25 with 3 seeds; 7 seeds can reach 0.025)'."""
    enough = next(k for k in range(2, 64) if 2 / 2**k < alpha)
    least = f"at least {2 / 2**n:.3g} with {n} seeds; {enough} can reach {alpha:.3g}"
    return f"the exact sign-flip test's p is {p:.3g} ({least})"


def no_spread(sa: dict, sb: dict, alpha: float) -> tuple[bool, float, str]:
    """(whether the exact test reaches alpha in the claimed direction, its p, a note) for seeds whose
    differences show no spread, where a t interval says nothing."""
    p = exact_p(sa, sb, side=0)
    n = min(len(sa), len(sb))
    note = f"no spread between the seeds: {exact_floor(p, n, alpha)}"
    return p < alpha, p, note

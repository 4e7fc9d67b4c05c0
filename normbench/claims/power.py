"""Planning a claim's confirmation: the seeds that give it 80% power at the level its family gives it,
and whether a design can decide at all.

A pilot estimates the paired difference a - b (its distance from the bound the claim is tested
against) and the spread of a seed's difference. The confirmation is planned with that spread at its
upper PLAN_CONFIDENCE bound (a chi-square bound on a standard deviation from few seeds: with two
degrees of freedom about 2.1x the estimate), so that a pilot whose seeds happened to agree does not
plan too few. The seed count is the fewest at which a one-sided t test at the family level has
POWER for the pilot's distance (the noncentral t: normbench.claims.smallsample.power), and, for a
claim decided by an exact test, at least the pairs whose smallest reachable p is below the level.

A stable_lr pilot whose seeds all moved by the same number of grid steps measures no spread beyond
the grid's rounding, a known floor rather than an estimate: it is planned with that floor
(``resolution_seeds``), the fewest seeds at which the floored interval clears the bound and the
two-sided exact test its level.

An exact sign-flip test on n pairs cannot give a p below 1 / 2^n one-sided (2 / 2^n two-sided): a
design whose floor is above its level can read neither reproduced nor not reproduced, whatever the
runs show. An equivalence test at n seeds passes only where the spread is below what its margin
allows (``spread_needed``).
"""

from __future__ import annotations

import math

from scipy import stats

from normbench.claims.smallsample import ALPHA, POWER, power

PLAN_CONFIDENCE = 0.8  # the upper confidence bound of the pilot's spread a confirmation is planned with
# A confirmation is planned within BUDGET_S seconds of a 2-core CPU (an hour: the registry's
# confirmations together fit in a few hours of background runs), costed from its claim's measured cost_s
# per run of the default sweep (a micro run takes seconds, a deep one minutes); a claim without a
# measured cost, within BUDGET_SEEDS seeds per arm.
BUDGET_S = 3600
BUDGET_SEEDS = 16


def family_level(family: int, alpha: float = ALPHA) -> float:
    """The level of the first claim under Holm across ``family`` claims: the one a design must reach."""
    return alpha / max(family, 1)


def spread_upper(sd: float, df: float, confidence: float = PLAN_CONFIDENCE) -> float:
    """The upper ``confidence`` bound of a standard deviation estimated as ``sd`` with ``df`` degrees
    of freedom: sd * sqrt(df / chi2_{1 - confidence}(df))."""
    if not df > 0 or not math.isfinite(sd):
        return math.nan
    return sd * math.sqrt(df / stats.chi2.ppf(1 - confidence, df))


def smallest_p(n: int, sides: int = 1) -> float:
    """The smallest p an exact sign-flip test on n untied pairs can give: every sign agreeing."""
    return min(1.0, sides / 2**n)


def exact_pairs(level: float, sides: int = 1) -> int:
    """The fewest pairs whose exact sign-flip test can reach a p below ``level``."""
    n = 1
    while smallest_p(n, sides) >= level:
        n += 1
    return n


def seeds_for(distance: float, sd: float, level: float, power_wanted: float = POWER) -> int | None:
    """The fewest seeds per arm (pairs) at which a one-sided t test at ``level`` has ``power_wanted``
    for a true distance ``distance`` from the bound at spread ``sd``; None when none up to 1000 does."""
    if not math.isfinite(distance) or not math.isfinite(sd) or distance <= 0:
        return None
    if sd == 0:
        return 2
    for n in range(2, 1000):
        if power(n, distance / sd, level, sides=1) >= power_wanted:
            return n
    return None


def planned_seeds(
    distance: float, sd: float, df: float, level: float, exact: bool = False
) -> tuple[int | None, float]:
    """(the confirmation's seeds per arm, the spread planned with): the spread at its upper bound,
    the t test's seeds, and for an exact test at least the pairs its level needs."""
    planned_sd = spread_upper(sd, df) if sd > 0 else 0.0
    n = seeds_for(abs(distance), planned_sd, level)
    if n is None:
        return None, planned_sd
    return (max(n, exact_pairs(level)) if exact else n), planned_sd


def resolution_seeds(distance: float, step: float, level: float) -> int | None:
    """The fewest pairs at which a pilot's distance from the bound, with no spread beyond a grid of
    ``step`` (each difference's rounding, step / sqrt(6): normbench.claims.smallsample.floored),
    clears the bound at ``level``: its t half-width below the distance, and a two-sided exact test's
    smallest p below the level. None when none up to 1000 does."""
    if not math.isfinite(distance) or not distance > 0 or not step > 0:
        return None
    for n in range(max(2, exact_pairs(level, sides=2)), 1000):
        if float(stats.t.ppf(1 - level / 2, n - 1)) * step / math.sqrt(6 * n) < distance:
            return n
    return None


def spread_needed(n: int, delta: float, level: float) -> float:
    """The largest seed spread at which an equivalence test (two one-sided t tests at ``level``) on n
    pairs can pass with an estimate of 0: t_{n-1, 1-level} * s / sqrt(n) < delta."""
    if n < 2:
        return 0.0
    return delta * math.sqrt(n) / float(stats.t.ppf(1 - level, n - 1))


def cannot_decide(
    kind: str,
    n: int,
    level: float,
    delta: float | None = None,
    spread: float = math.nan,
    estimate: float = math.nan,
) -> str:
    """Why a design of ``n`` seeds per arm cannot reach ``level`` (empty when it can): an exact test's
    floor above the level; an equivalence whose pilot lies inside its margin (so the design is planned
    to show it inside) at a spread wider than ``n`` seeds can show inside it. A pilot beyond the margin
    is planned to refute it, which a wide spread does not prevent."""
    if kind in ("steps_to_target", "stable_lr") and smallest_p(n) >= level:
        return (
            f"an exact test on {n} pairs cannot give a p below {smallest_p(n):.3g}, above its level "
            f"{level:.3g}: it needs {exact_pairs(level)} pairs"
        )
    inside = math.isfinite(estimate) and delta is not None and abs(estimate) < delta
    if kind == "equivalent" and inside and spread >= spread_needed(n, delta, level):
        return (
            f"equivalence within ±{delta:g} at level {level:.3g} on {n} seeds needs a seed spread below "
            f"{spread_needed(n, delta, level):.3g}; the pilot's is {spread:.3g}"
        )
    return ""

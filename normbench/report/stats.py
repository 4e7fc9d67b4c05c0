"""Seed statistics: 95% confidence intervals of a mean and of a difference of two means (scipy).

The method depends on what the data can carry, and every result names the one it used:

- fewer than 2 values: no interval ("needs ≥ 2 seeds");
- values without any spread (identical): the interval is the point itself ("no spread");
- 2 to 4 values: Student's t interval. A bootstrap from so few values resamples at most a few
  dozen distinct sets, so its interval is too narrow; the t interval is the honest small-sample one;
- 5 or more: the bootstrap (Agarwal et al. 2021), ``scipy.stats.bootstrap`` with BCa and 9,999
  resamples from a fixed generator (the same runs give the same report); where BCa cannot be
  computed (it needs an acceleration estimate that degenerate samples lack), the percentile method.

A difference is *paired by seed* when both sides ran exactly the same seeds, once each: runs
with the same seed share the data order and the initial weights, so the per-seed differences
cancel that shared noise (``paired=True`` bootstrap, ``ttest_rel``). Otherwise it is Welch's
unequal-variance comparison (independent resampling of each side, ``ttest_ind(equal_var=False)``).

The scale axis's trend (normbench.report.scale, whose module doc states the method): ``fit_trend``
fits a gap against log2 of the size by least squares with a t interval on the slope from the sizes'
standard errors, and ``trend_word`` names what the gap does (grows, shrinks, flips sign, no trend).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
N_RESAMPLES = 9999
MIN_BOOTSTRAP = 5  # fewer values than this get a t interval
NEEDS_SEEDS = "needs ≥ 2 seeds"


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    method: str

    def __contains__(self, value: float) -> bool:
        return self.low <= value <= self.high


@dataclass(frozen=True)
class Comparison:
    """mean(a) - mean(b), its interval (None with fewer than 2 values a side) and a p-value.

    ``se`` and ``df``: the difference's standard error and degrees of freedom as the t test
    computes them (paired: n - 1; Welch: Satterthwaite's), NaN without an interval; the scale
    axis's trend fit weighs each size by them (normbench.report.scale).
    """

    diff: float
    ci: Interval | None
    p: float
    paired: bool
    se: float
    df: float

    @property
    def tied(self) -> bool:
        return self.ci is not None and 0.0 in self.ci

    @property
    def method(self) -> str:
        if self.ci is None:
            return NEEDS_SEEDS
        return f"{'paired by seed' if self.paired else 'Welch'}, {self.ci.method}"


def satterthwaite(variances, dfs) -> tuple[float, float]:
    """The sum of independent variance shares and its Welch-Satterthwaite degrees of freedom (inf with no
    variance): what a difference of two means, a trend's slope and a prediction all carry."""
    v, df = np.asarray(variances, float), np.asarray(dfs, float)
    total, some = float(v.sum()), v > 0
    return total, (total**2 / float(np.sum(v[some] ** 2 / df[some])) if total > 0 else math.inf)


def _finite(values) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    return x[np.isfinite(x)]


def _bootstrap(samples: tuple, statistic, paired: bool) -> Interval:
    def run(method):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a degenerate BCa warns and returns NaN: handled below
            result = stats.bootstrap(
                samples,
                statistic,
                paired=paired,
                vectorized=True,
                method=method,
                confidence_level=CONFIDENCE,
                n_resamples=N_RESAMPLES,
                rng=np.random.default_rng(0),
            )
        return float(result.confidence_interval.low), float(result.confidence_interval.high)

    low, high = run("BCa")
    if math.isfinite(low) and math.isfinite(high):
        return Interval(low, high, "bootstrap BCa")
    return Interval(*run("percentile"), "bootstrap percentile")


def _mean(x, axis=-1):
    return np.mean(x, axis=axis)


def _mean_diff(a, b, axis=-1):
    return np.mean(a, axis=axis) - np.mean(b, axis=axis)


def mean_ci(values) -> Interval | None:
    """95% interval of the mean of ``values`` (non-finite ones dropped); None below 2 values."""
    x = _finite(values)
    if len(x) < 2:
        return None
    if np.ptp(x) == 0:
        return Interval(float(x[0]), float(x[0]), "no spread")
    if len(x) < MIN_BOOTSTRAP:
        low, high = stats.t.interval(CONFIDENCE, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
        return Interval(float(low), float(high), "t")
    return _bootstrap((x,), _mean, paired=False)


def _pairs(a: dict, b: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-seed values of both sides, in the same seed order, when both ran exactly the same seeds."""
    if len(a) < 2 or set(a) != set(b):
        return None
    seeds = sorted(a)
    return np.array([a[s] for s in seeds], float), np.array([b[s] for s in seeds], float)


def compare(a: dict | list, b: dict | list) -> Comparison:
    """mean(a) - mean(b) with a 95% interval and a two-sided p-value.

    ``a`` and ``b`` are {seed: value} (finite values only) or plain lists; dicts over the same
    seeds are compared paired by seed, anything else with Welch's test.
    """
    with warnings.catch_warnings():
        # scipy warns about precision loss for nearly identical values; the interval is still right
        warnings.simplefilter("ignore", RuntimeWarning)
        return _compare(a, b)


def _compare(a, b) -> Comparison:
    pairs = _pairs(a, b) if isinstance(a, dict) and isinstance(b, dict) else None
    xa = _finite(list(a.values()) if isinstance(a, dict) else a)
    xb = _finite(list(b.values()) if isinstance(b, dict) else b)
    diff = float(xa.mean() - xb.mean()) if len(xa) and len(xb) else math.nan
    if len(xa) < 2 or len(xb) < 2:
        return Comparison(diff, None, math.nan, paired=False, se=math.nan, df=math.nan)
    if pairs is not None:
        pa, pb = pairs
        d = pa - pb
        paired = dict(paired=True, se=float(stats.sem(d)), df=len(d) - 1.0)
        if np.ptp(d) == 0:  # every seed moved by exactly the same amount: no spread to test
            return Comparison(diff, Interval(float(d[0]), float(d[0]), "no spread"), math.nan, **paired)
        test = stats.ttest_rel(pa, pb)
        if len(d) < MIN_BOOTSTRAP:
            ci = test.confidence_interval(CONFIDENCE)
            return Comparison(
                diff, Interval(float(ci.low), float(ci.high), "t"), float(test.pvalue), **paired
            )
        return Comparison(diff, _bootstrap((pa, pb), _mean_diff, paired=True), float(test.pvalue), **paired)
    var, df = satterthwaite(
        [np.var(xa, ddof=1) / len(xa), np.var(xb, ddof=1) / len(xb)], [len(xa) - 1, len(xb) - 1]
    )
    welch = dict(paired=False, se=math.sqrt(var), df=df)
    if np.ptp(xa) == 0 and np.ptp(xb) == 0:
        return Comparison(diff, Interval(diff, diff, "no spread"), math.nan, **welch)
    test = stats.ttest_ind(xa, xb, equal_var=False)
    if min(len(xa), len(xb)) < MIN_BOOTSTRAP:
        ci = test.confidence_interval(CONFIDENCE)
        return Comparison(diff, Interval(float(ci.low), float(ci.high), "t"), float(test.pvalue), **welch)
    return Comparison(diff, _bootstrap((xa, xb), _mean_diff, paired=False), float(test.pvalue), **welch)


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
    the sizes' own standard errors (normbench.report.scale's module doc)."""
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

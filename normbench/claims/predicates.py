"""Predicates: a claim's runs -> its verdict word, estimate, interval, n and test.

Each arm is the runs whose config matches the claim's ``compare.a`` (``b``), taken at its own best
value of ``compare.tune`` as normbench.report.tuning chooses it (the lowest mean final validation
loss over the completed seeds). Seeds are compared with normbench.report.stats.compare (paired by
seed when both arms ran the same seeds, Welch otherwise). The words:

- better / worse: the interval of the difference a - b (of the logs, with ``compare.log``) excludes
  0 on the claimed side (lower is better for a loss, higher for tokens_per_s and mfu): reproduced;
  on the other side, or inside ±delta by two one-sided tests (equivalence where a difference was
  claimed): not reproduced;
- not_worse: a is at most delta worse than b: the interval's unfavourable end inside delta:
  reproduced; its favourable end beyond delta (worse by more): not reproduced;
- equivalent: two one-sided tests at margin delta, i.e. the (1 - 2 alpha) interval inside ±delta:
  reproduced; the (1 - alpha) interval wholly outside ±delta: not reproduced;
- trend: the slope of the gap a - b (or of a's per-seed best tuning value, in log2) per doubling of
  the size key, normbench.report.scale.fit_trend's least-squares fit; its interval on the claimed side
  (or inside ±delta for flat): reproduced; on the other side (outside ±delta): not reproduced;
- rate: divergences of a against b, Fisher's exact test (one-sided in the claimed direction);
- steps_to_target: per seed, the first evaluated step at which a's validation loss reaches the
  baseline b's mean final loss, over b's own steps to it (a run that never reaches it counts its
  last step: the ratio is then a lower bound, and said so); the geometric mean ratio with the
  interval of the log ratio; below the claimed bound: reproduced, above it: not reproduced;
- stable_lr: per seed, the largest tuning value at which the run did not diverge or fail; the
  ratio a/b (log2, compared by seed) at least ``factor``: reproduced, below it: not reproduced.

Anything else is inconclusive, with the reason: fewer than min_seeds completed seeds (no interval
is computed from fewer), or an interval too wide, with the seeds per arm that would settle it at
the measured spread if the estimate held. ``alpha`` is the family level of one claim: 0.05
alone, smaller under Holm's correction (normbench.claims.verdicts), where the intervals are the
t intervals at that level.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from normbench.claims.schema import Claim
from normbench.report.load import ReportData
from normbench.report.metrics import HIGHER_IS_BETTER
from normbench.report.scale import fit_trend
from normbench.report.stats import CONFIDENCE, Comparison, compare
from normbench.report.tables import varying_keys
from normbench.report.tuning import tune

ALPHA = 1 - CONFIDENCE
MAX_SEEDS = 1000  # beyond this, "no seed count settles it"


@dataclass
class Outcome:
    verdict: str  # reproduced, not reproduced, inconclusive
    estimate: float = math.nan
    low: float = math.nan
    high: float = math.nan
    unit: str = ""  # what the estimate is: "a - b", "ratio a/b", "slope per doubling", ...
    level: str = ""  # the interval's confidence, e.g. "95%", "90% (TOST)"
    n_a: int = 0
    n_b: int = 0
    test: str = ""
    p: float = math.nan  # the p-value of the test that calls it reproduced (Holm orders by it)
    reason: str = ""
    runs: list = dataclasses.field(default_factory=list)  # the run directories the verdict used
    spread: float = math.nan  # the seeds' standard deviation of a - b here: what a margin δ is set against


def _inconclusive(reason: str, **kw) -> Outcome:
    return Outcome("inconclusive", reason=reason, **kw)


# ----------------------------------------------------------------------------- the arms


def _matches(column: pd.Series, value) -> pd.Series:
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
        mask &= _matches(runs[key], value) if key in runs else False
    return runs[mask]


def _warn(message: str) -> None:
    """The tuning's warnings concern the report's LR-sensitivity column, which a verdict does not use."""


def best_values(d: ReportData, runs: pd.DataFrame, key: str | None, by: str | None = None) -> dict:
    """{size: best value of ``key``} for the runs (size None without ``by``), normbench.report.tuning's
    choice; {} when ``key`` is None or takes one value here (every run counts)."""
    if key is None or key not in runs or runs[key].nunique() < 2:
        return {}
    part = dataclasses.replace(d, runs=runs, keys=[*([by] if by else []), key])
    tuned = tune(part, key, _warn)
    return {(row[by] if by else None): row["best_value"] for _, row in tuned.iterrows()}


def at_best(d: ReportData, runs: pd.DataFrame, key: str | None, by: str | None = None) -> pd.DataFrame:
    """The runs at their (per size) best value of ``key``."""
    best = best_values(d, runs, key, by)
    if not best:
        return runs
    chosen = runs[by].map(best) if by else pd.Series(best[None], index=runs.index)
    return runs[pd.to_numeric(runs[key], errors="coerce").sub(pd.to_numeric(chosen)).abs().le(1e-15)]


def samples(runs: pd.DataFrame, metric: str, log: bool = False) -> dict:
    """{seed: metric} (its natural log with ``log``) over the completed runs with a finite value (and
    a positive one with ``log``); seeds are distinct within an arm."""
    if metric not in runs:
        return {}
    values = pd.to_numeric(runs[metric], errors="coerce")
    if log:
        values = np.log(values.where(values > 0))
    done = runs[runs["status"].eq("completed") & np.isfinite(values)]
    return dict(zip(done["seed"], values[done.index]))


# ----------------------------------------------------------------------------- intervals and seed counts


def interval(c: Comparison, alpha: float) -> tuple[float, float]:
    """c's interval at confidence 1 - alpha: stats.compare's own at 95%, the t interval otherwise."""
    if math.isclose(alpha, ALPHA) and c.ci is not None:
        return c.ci.low, c.ci.high
    half = 0.0 if not c.se > 0 else float(stats.t.ppf(1 - alpha / 2, c.df) * c.se)
    return c.diff - half, c.diff + half


def _t_p(diff: float, se: float, df: float) -> float:
    """Two-sided p of diff against 0 with standard error se (0 when there is no spread and diff != 0)."""
    if not se > 0:
        return 0.0 if diff != 0 else 1.0
    return float(2 * stats.t.sf(abs(diff) / se, df))


def tost_p(diff: float, se: float, df: float, delta: float) -> float:
    """Two one-sided tests of |diff| < delta: the larger of the two one-sided p-values."""
    if not se > 0:
        return 0.0 if abs(diff) < delta else 1.0
    return float(max(stats.t.sf((diff + delta) / se, df), stats.t.cdf((diff - delta) / se, df)))


def seeds_needed(sd: float, margin: float, alpha: float) -> str:
    """'about N seeds per arm would settle it': the seeds whose t interval half-width is below
    ``margin`` at the measured spread ``sd`` (the spread of a seed's difference)."""
    if not margin > 0 or not math.isfinite(sd):
        return "no seed count settles it at this estimate"
    if sd == 0:
        return "2 seeds per arm would settle it"
    for n in range(2, MAX_SEEDS):
        if stats.t.ppf(1 - alpha / 2, n - 1) * sd / math.sqrt(n) < margin:
            return f"about {n} seeds per arm would settle it (spread {sd:.3g})"
    return f"more than {MAX_SEEDS} seeds per arm would be needed (spread {sd:.3g})"


def _sd(c: Comparison, n: int) -> float:
    return c.se * math.sqrt(n) if c.se > 0 else 0.0


def _too_few(claim: Claim, n_a: int, n_b: int, what: str = "completed seeds") -> str | None:
    if min(n_a, n_b) < claim.min_seeds:
        return f"{n_a} and {n_b} {what} per arm, fewer than min_seeds {claim.min_seeds}: no interval"
    return None


def _several(d: ReportData, arms: dict, by: list) -> str | None:
    """Why an arm cannot be compared seed by seed: it holds several runs of one seed (at one value of
    ``by``) that differ in another key, which the claim's arm should name."""
    for side, runs in arms.items():
        if len(runs) and runs.duplicated(["seed", *[k for k in by if k]]).any():
            keys = [k for k in varying_keys(runs, d.config_keys) if k not in by] or ["their run directories"]
            differ = ", ".join(keys)
            return f"arm {side} holds several runs per seed, differing in {differ}: name it in compare.{side}"
    return None


# ----------------------------------------------------------------------------- the predicates


def _difference(claim: Claim, d: ReportData, alpha: float) -> Outcome:
    a = at_best(d, arm(d.runs, claim.a), claim.tune)
    b = at_best(d, arm(d.runs, claim.b), claim.tune)
    sa, sb = samples(a, claim.metric, claim.log), samples(b, claim.metric, claim.log)
    measure = f"log {claim.metric}" if claim.log else claim.metric
    base = dict(n_a=len(sa), n_b=len(sb), unit=f"{measure}: a - b", runs=[*a["run_dir"], *b["run_dir"]])
    if reason := _several(d, {"a": a, "b": b}, []) or _too_few(claim, len(sa), len(sb)):
        return _inconclusive(reason, **base)
    c = compare(sa, sb)
    n, delta = min(len(sa), len(sb)), claim.predicate.get("delta")
    base.update(estimate=c.diff, test=f"difference of means, {c.method}", spread=_sd(c, n))
    if claim.kind == "equivalent":
        p = tost_p(c.diff, c.se, c.df, delta)
        low, high = interval(dataclasses.replace(c, ci=None), 2 * alpha)
        wide_low, wide_high = interval(c, alpha)
        base.update(low=low, high=high, p=p, level=f"{100 * (1 - 2 * alpha):.3g}% (TOST, ±{delta:g})")
        base["test"] = f"two one-sided tests at ±{delta:g}, {c.method}"
        if p < alpha:
            return Outcome("reproduced", **base)
        if wide_low > delta or wide_high < -delta:
            return Outcome("not reproduced", reason=f"the difference exceeds ±{delta:g}", **base)
        return _inconclusive(seeds_needed(_sd(c, n), delta - abs(c.diff), alpha), **base)
    # better / worse / not_worse: the sign of a - b that is an improvement for a
    want = 1 if (claim.kind == "worse") != (claim.metric in HIGHER_IS_BETTER) else -1
    low, high = interval(c, alpha)
    base.update(low=low, high=high, level=f"{100 * (1 - alpha):.3g}%")
    if claim.kind == "not_worse":  # how much worse a is: -want * (a - b), at most delta
        worst, least = max(-want * low, -want * high), min(-want * low, -want * high)
        base["p"] = (
            float(stats.t.cdf((-want * c.diff - delta) / c.se, c.df))
            if c.se > 0
            else float(-want * c.diff >= delta)
        )
        base["test"] = f"non-inferiority at {delta:g}, {c.method}"
        if worst < delta:
            return Outcome("reproduced", **base)
        if least > delta:
            return Outcome("not reproduced", reason=f"a is worse by more than {delta:g}", **base)
        return _inconclusive(seeds_needed(_sd(c, n), delta + want * c.diff, alpha), **base)
    claimed = c.diff * want > 0
    base["p"] = _t_p(c.diff, c.se, c.df) if claimed else 1.0
    if want * low > 0 and want * high > 0:
        return Outcome("reproduced", **base)
    if want * low < 0 and want * high < 0:
        return Outcome("not reproduced", reason="the difference is significant the other way", **base)
    if delta is not None and tost_p(c.diff, c.se, c.df, delta) < alpha:
        return Outcome("not reproduced", reason=f"equivalent within ±{delta:g} (two one-sided tests)", **base)
    return _inconclusive(seeds_needed(_sd(c, n), abs(c.diff), alpha), **base)


def _per_seed_best(runs: pd.DataFrame, key: str, metric: str) -> dict:
    """{seed: log2 of the value of ``key`` with the seed's lowest ``metric``} over completed runs."""
    done = runs[runs["status"].eq("completed") & pd.to_numeric(runs[metric], errors="coerce").notna()]
    best = done.loc[done.groupby("seed")[metric].idxmin()] if len(done) else done
    return dict(zip(best["seed"], np.log2(pd.to_numeric(best[key]))))


def _trend(claim: Claim, d: ReportData, alpha: float) -> Outcome:
    p = claim.predicate
    axis, runs_a = p["axis"], arm(d.runs, claim.a)
    runs_b = arm(d.runs, claim.b) if p["of"] == "gap" else runs_a.iloc[:0]
    if axis not in d.runs:
        return _inconclusive(f"the runs do not vary {axis}")
    if reason := _several(d, {"a": runs_a, "b": runs_b}, [axis, claim.tune]):
        return _inconclusive(reason)
    sizes = sorted(pd.to_numeric(pd.concat([runs_a[axis], runs_b[axis]])).dropna().unique())
    x, gap, se, df, ns = [], [], [], [], []
    for size in sizes:
        sa_runs = runs_a[_matches(runs_a[axis], float(size))]
        if p["of"] == "gap":
            sb_runs = runs_b[_matches(runs_b[axis], float(size))]
            sa = samples(at_best(d, sa_runs, claim.tune), claim.metric, claim.log)
            sb = samples(at_best(d, sb_runs, claim.tune), claim.metric, claim.log)
            if min(len(sa), len(sb)) < claim.min_seeds:
                continue
            c = compare(sa, sb)
            gap_i, se_i, df_i, n_i = c.diff, c.se, c.df, min(len(sa), len(sb))
        else:
            logs = list(_per_seed_best(sa_runs, claim.tune, claim.metric).values())
            if len(logs) < claim.min_seeds:
                continue
            gap_i, se_i, df_i, n_i = float(np.mean(logs)), float(stats.sem(logs)), len(logs) - 1.0, len(logs)
        x.append(size), gap.append(gap_i), se.append(se_i), df.append(df_i), ns.append(n_i)
    unit = (
        "slope of "
        + ("a - b" if p["of"] == "gap" else f"log2 best {claim.tune}")
        + f" per doubling of {axis}"
    )
    base = dict(unit=unit, n_a=min(ns, default=0), n_b=min(ns, default=0) if p["of"] == "gap" else 0)
    base["runs"] = [*runs_a["run_dir"], *runs_b["run_dir"]]
    if len(x) < 2:
        return _inconclusive(
            f"{len(x)} of {len(sizes)} sizes of {axis} with min_seeds {claim.min_seeds} seeds per arm: "
            "a trend needs 2",
            **base,
        )
    fit = fit_trend(x, gap, se, df)
    t95 = stats.t.ppf(1 - ALPHA / 2, fit.df)
    slope_se = (fit.high - fit.slope) / t95 if fit.high > fit.slope else 0.0
    c = Comparison(fit.slope, None, math.nan, paired=False, se=slope_se, df=fit.df)
    base.update(estimate=fit.slope, test=f"least squares over {len(x)} sizes ({fit.method}), t interval")
    if p["direction"] == "flat":
        delta = p["delta"]
        low, high = interval(c, 2 * alpha)
        base.update(low=low, high=high, p=tost_p(fit.slope, slope_se, fit.df, delta))
        base["level"] = f"{100 * (1 - 2 * alpha):.3g}% (TOST, ±{delta:g})"
        if base["p"] < alpha:
            return Outcome("reproduced", **base)
        wide_low, wide_high = interval(c, alpha)
        if wide_low > delta or wide_high < -delta:
            return Outcome("not reproduced", reason=f"the slope exceeds ±{delta:g}", **base)
        return _inconclusive(f"the slope's interval is wider than ±{delta:g}: more seeds or sizes", **base)
    want = 1 if p["direction"] == "increasing" else -1
    low, high = interval(c, alpha)
    claimed = fit.slope * want > 0
    base.update(low=low, high=high, p=_t_p(fit.slope, slope_se, fit.df) if claimed else 1.0)
    base["level"] = f"{100 * (1 - alpha):.3g}%"
    if want * low > 0 and want * high > 0:
        return Outcome("reproduced", **base)
    if want * low < 0 and want * high < 0:
        return Outcome("not reproduced", reason="the slope is significant the other way", **base)
    return _inconclusive("the slope's interval includes 0: more seeds or sizes", **base)


def _rate(claim: Claim, d: ReportData, alpha: float) -> Outcome:
    a, b = arm(d.runs, claim.a), arm(d.runs, claim.b)
    finished = ("completed", "diverged")
    a, b = a[a["status"].isin(finished)], b[b["status"].isin(finished)]
    da, db = int(a["status"].eq("diverged").sum()), int(b["status"].eq("diverged").sum())
    table = [[da, len(a) - da], [db, len(b) - db]]
    more = claim.predicate["direction"] == "more"
    base = dict(n_a=len(a), n_b=len(b), unit="diverged share, a - b", runs=[*a["run_dir"], *b["run_dir"]])
    if reason := _too_few(claim, len(a), len(b), "finished runs"):
        return _inconclusive(reason, **base)
    side, other = ("greater", "less") if more else ("less", "greater")
    p_claim = float(stats.fisher_exact(table, alternative=side).pvalue)
    p_other = float(stats.fisher_exact(table, alternative=other).pvalue)
    base.update(
        estimate=da / len(a) - db / len(b),
        p=p_claim,
        test=f"Fisher's exact test, one-sided ({da}/{len(a)} vs {db}/{len(b)} diverged)",
    )
    if p_claim < alpha:
        return Outcome("reproduced", **base)
    if p_other < alpha:
        return Outcome("not reproduced", reason="significantly the other way", **base)
    if da == db == 0:
        return _inconclusive("no run diverged in either arm: a higher learning rate or more depth", **base)
    for k in range(2, 50):  # the same shares with k times the runs
        if stats.fisher_exact([[v * k for v in row] for row in table], alternative=side).pvalue < alpha:
            return _inconclusive(
                f"about {k * min(len(a), len(b))} runs per arm would settle it at these shares", **base
            )
    return _inconclusive("no run count settles it at these shares", **base)


def steps_to(evals: pd.DataFrame, run, target: float) -> tuple[float, bool]:
    """(the first evaluated step with val_loss <= target, reached); unreached: (the last step, False)."""
    curve = evals[evals["run"].eq(run) & evals["step"].gt(0)].sort_values("step")
    reached = curve[curve["val_loss"] <= target]
    if len(reached):
        return float(reached["step"].iloc[0]), True
    return (float(curve["step"].iloc[-1]) if len(curve) else math.nan), False


def _steps(claim: Claim, d: ReportData, alpha: float) -> Outcome:
    a = at_best(d, arm(d.runs, claim.a), claim.tune)
    b = at_best(d, arm(d.runs, claim.b), claim.tune)
    a, b = (r[r["status"].eq("completed")] for r in (a, b))
    base = dict(
        n_a=len(a), n_b=len(b), unit="steps ratio a/b to b's final loss", runs=[*a["run_dir"], *b["run_dir"]]
    )
    if reason := _several(d, {"a": a, "b": b}, []) or _too_few(claim, len(a), len(b)):
        return _inconclusive(reason, **base)
    target = float(b["final_val_loss"].mean())
    logs, unreached = {}, 0
    for side, runs in (("a", a), ("b", b)):
        logs[side] = {}
        for run, row in runs.iterrows():
            steps, reached = steps_to(d.evals, run, target)
            unreached += side == "a" and not reached
            if steps > 0:
                logs[side][row["seed"]] = math.log(steps)
    c = compare(logs["a"], logs["b"])
    if c.ci is None:
        return _inconclusive("fewer than 2 seeds a side with an evaluated step", **base)
    low, high = interval(c, alpha)
    bound = math.log(claim.predicate["below"])
    base.update(
        estimate=math.exp(c.diff),
        low=math.exp(low),
        high=math.exp(high),
        level=f"{100 * (1 - alpha):.3g}%",
        p=_t_p(c.diff - bound, c.se, c.df) if c.diff < bound else 1.0,
        test=f"log steps to loss {target:.4f}, {c.method}",
    )
    note = f"; {unreached} run(s) of a never reached it (counted at their last step)" if unreached else ""
    if high < bound:
        return Outcome("reproduced", reason=note.lstrip("; "), **base)
    if low > bound:
        return Outcome(
            "not reproduced",
            reason=f"a needs more than {claim.predicate['below']:g}x b's steps{note}",
            **base,
        )
    return _inconclusive(seeds_needed(_sd(c, min(len(a), len(b))), abs(c.diff - bound), alpha) + note, **base)


def _stable_lr(claim: Claim, d: ReportData, alpha: float) -> Outcome:
    key, factor = claim.tune, claim.predicate["factor"]
    sides, top = {}, {}
    for side, spec in (("a", claim.a), ("b", claim.b)):
        runs = arm(d.runs, spec)
        runs = runs[runs["status"].isin(("completed", "diverged", "failed"))]
        values = pd.to_numeric(runs[key], errors="coerce") if key in runs else pd.Series(dtype=float)
        ok = runs[runs["status"].eq("completed")]
        stable = ok.assign(_v=values[ok.index]).groupby("seed")["_v"].max()
        sides[side] = {s: math.log2(v) for s, v in stable.items()}
        top[side] = values.max() if len(values) else math.nan
    base = dict(n_a=len(sides["a"]), n_b=len(sides["b"]), unit=f"largest stable {key}, ratio a/b")
    base["runs"] = [*arm(d.runs, claim.a)["run_dir"], *arm(d.runs, claim.b)["run_dir"]]
    arms = {"a": arm(d.runs, claim.a), "b": arm(d.runs, claim.b)}
    if reason := _several(d, arms, [key]) or _too_few(
        claim, len(sides["a"]), len(sides["b"]), "seeds with a stable run"
    ):
        return _inconclusive(reason, **base)
    c = compare(sides["a"], sides["b"])
    low, high = interval(c, alpha)
    bound = math.log2(factor)
    base.update(
        estimate=2**c.diff,
        low=2**low,
        high=2**high,
        level=f"{100 * (1 - alpha):.3g}%",
        p=_t_p(c.diff - bound, c.se, c.df) if c.diff >= bound else 1.0,
        test=f"log2 largest non-diverging {key} per seed, {c.method}",
    )
    # An arm that never diverged is censored at the grid's top: its true rate is higher still. So a
    # censored b makes the ratio an upper bound (only "not reproduced" can be read), a censored a a
    # lower bound (only "reproduced").
    censored = {side: all(v == math.log2(top[side]) for v in sides[side].values()) for side in sides}
    if low >= bound - 1e-12 and not censored["b"]:
        return Outcome("reproduced", **base)
    if high < bound and not censored["a"]:
        return Outcome("not reproduced", reason=f"a's largest stable {key} is below {factor:g}x b's", **base)
    if censored["a"] or censored["b"]:
        which = " and ".join(side for side in ("a", "b") if censored[side])
        return _inconclusive(
            f"{which} never diverged up to {key}={max(top.values()):g}: widen the grid", **base
        )
    return _inconclusive(seeds_needed(_sd(c, base["n_a"]), abs(c.diff - bound), alpha), **base)


PREDICATES = {
    "better": _difference,
    "worse": _difference,
    "not_worse": _difference,
    "equivalent": _difference,
    "trend": _trend,
    "rate": _rate,
    "steps_to_target": _steps,
    "stable_lr": _stable_lr,
}


def judge(claim: Claim, d: ReportData, alpha: float = ALPHA) -> Outcome:
    """The claim's verdict from its runs ``d`` at family level ``alpha``."""
    return PREDICATES[claim.kind](claim, d, alpha)

"""Predicates: a claim's runs -> its verdict word, estimate, interval, n and test.

Each predicate reads the claim's arms (normbench.claims.arms) with the small-sample statistics of
normbench.claims.smallsample. The words:

- better / worse: the interval of the difference a - b (of the logs, with ``compare.log``) excludes
  0 on the claimed side (lower is better for a loss, higher for tokens_per_s and mfu): reproduced;
  on the other side: not reproduced; equivalent within ±delta by two one-sided tests refutes the
  claim only where delta is smaller than the effect the source reports (``predicate.effect``): a
  margin as wide as the claimed effect cannot tell the effect from none;
- not_worse: a is at most delta worse than b, a one-sided test at alpha whose bound is the
  (1 - 2 alpha) interval's unfavourable end (as for two one-sided tests): inside delta: reproduced;
  its favourable end beyond delta (worse by more, one-sided at alpha): not reproduced;
- equivalent: two one-sided tests at margin delta, i.e. the (1 - 2 alpha) interval inside ±delta:
  reproduced; the (1 - 2 alpha) interval wholly outside ±delta: not reproduced;
- trend: the slope of the gap a - b (or of a's per-seed best tuning value, in log2) per doubling of
  the size key, normbench.report.stats.fit_trend's least-squares fit (inconclusive where the sizes
  scatter about the line more than their seeds explain: its lack-of-fit test at alpha); its interval
  on the claimed side (or inside ±delta for flat): reproduced; on the other side (outside ±delta):
  not reproduced. A flat best value (a transfer claim) needs its control ``b`` beside it (standard
  parametrization): reproduced only where a's slope is within ±delta and b's is not, so the grid
  is shown able to see a best value move; where b's does not move either, inconclusive;
- rate: unstable runs of a against b (diverged, or finished without learning as stable_lr reads it),
  Fisher's exact test (one-sided in the claimed direction);
- steps_to_target: per seed, the first evaluated step at which the validation loss reaches the
  baseline's final loss on that seed (the claims' words: "reaches the baseline's final loss in fewer
  steps"); the geometric mean ratio a/b with the interval of the log ratio; below the claimed bound:
  reproduced, above it: not reproduced. A run of a that never reaches it is read one evaluation past
  its last step, a lower bound: the ratio is then a bound, and only "not reproduced" can be read;
- stable_lr: per seed, the largest tuning value at which the run stayed stable: finished, finite and
  learned (its final validation loss at most STABLE_FRACTION of its own loss at initialisation); the
  ratio a/b (log2, compared by seed) at least ``factor``: reproduced, below it: not reproduced. A run
  that failed for another reason (a crash, not the numerics) is not read as unstable: it is left out,
  with the seed whose limit it hides, and the verdict says so.

Anything else is inconclusive, with the reason: fewer than min_seeds completed seeds (no interval
is computed from fewer), or an interval too wide, with the seeds per arm that would give 80% power
at the measured spread if the estimate held. ``alpha`` is the family level of one claim: 0.05
alone, smaller under Holm's correction (normbench.claims.verdicts), where the intervals are the
t intervals at that level.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from normbench.claims.arms import arm, at_best, grid, log2_step, matches, per_seed_best, samples
from normbench.claims.schema import Claim
from normbench.claims.smallsample import (
    ALPHA,
    exact_floor,
    exact_p,
    floored,
    interval,
    no_spread,
    outside_p,
    seed_sd,
    seeds_needed,
    t_p,
    tost_p,
)
from normbench.core.runs import LEARN_MARGIN
from normbench.report.load import LEARNED_FRACTION, ReportData
from normbench.report.metrics import HIGHER_IS_BETTER
from normbench.report.stats import Comparison, compare, fit_trend
from normbench.report.tables import varying_keys
from normbench.report.tuning import failed_note

STABLE_FRACTION = LEARNED_FRACTION  # a stable run learned, as the report reads it: below this share of init


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
    p: float = math.nan  # the p-value of the test that decides its word, either way (Holm orders by it)
    reason: str = ""
    runs: list = dataclasses.field(default_factory=list)  # the run directories the verdict used
    spread: float = math.nan  # the seeds' standard deviation of a - b here: what a margin δ is set against


def _inconclusive(reason: str, **kw) -> Outcome:
    return Outcome("inconclusive", reason=reason, **kw)


def _join(*notes: str | None) -> str:
    return "; ".join(n for n in notes if n)


def _settled(word: str, reason: str, edge: str | None, **base) -> Outcome:
    """The verdict ``word``, unless an arm's best value sits at the grid's edge: off the grid it may do
    better still, so the word is only what this grid reads, and the verdict inconclusive."""
    if edge:
        return _inconclusive(_join(edge, f"on this grid it would read {word} ({reason})"), **base)
    return Outcome(word, reason=reason, **base)


# ----------------------------------------------------------------------------- what cannot be compared


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


def lr_sensitivity(runs: pd.DataFrame, key: str) -> dict:
    """Each seed's learning-rate sensitivity over the grid of ``key`` (Wortsman et al. 2023, §2.2): the mean
    over the grid of min(final loss, loss at init) minus its smallest value, a diverged run counting as its
    loss at init (it learned nothing). A seed with a failed run, a value of the grid missing, or no loss
    at init has none: a crash says nothing of stability."""
    grid = sorted(pd.to_numeric(runs[key], errors="coerce").dropna().unique())
    init = pd.to_numeric(runs["init_val_loss"], errors="coerce")
    final = pd.to_numeric(runs["final_val_loss"], errors="coerce").where(runs["status"].eq("completed"), init)
    capped = final.clip(upper=init)
    out = {}
    for seed, group in runs.assign(_v=pd.to_numeric(runs[key], errors="coerce"), _c=capped).groupby("seed"):
        per_value = group.groupby("_v")["_c"].mean()
        if group["status"].eq("failed").any() or len(per_value) < len(grid) or per_value.isna().any():
            continue
        out[seed] = float((per_value - per_value.min()).mean())
    return out


def _difference(claim: Claim, d: ReportData, alpha: float) -> Outcome:
    if claim.metric == "lr_sensitivity":  # a property of each seed's whole grid: no value is chosen
        a, b, edge_a, edge_b = arm(d.runs, claim.a), arm(d.runs, claim.b), "", ""
        sa, sb = lr_sensitivity(a, claim.tune), lr_sensitivity(b, claim.tune)
        by = [claim.tune]
    else:
        a, edge_a = at_best(arm(d.runs, claim.a), claim.tune, "a")
        b, edge_b = at_best(arm(d.runs, claim.b), claim.tune, "b")
        sa, sb = samples(a, claim.metric, claim.log), samples(b, claim.metric, claim.log)
        by = []
    measure = f"log {claim.metric}" if claim.log else claim.metric
    base = dict(n_a=len(sa), n_b=len(sb), unit=f"{measure}: a - b", runs=[*a["run_dir"], *b["run_dir"]])
    if reason := _several(d, {"a": a, "b": b}, by) or _too_few(claim, len(sa), len(sb)):
        return _inconclusive(reason, **base)
    c = compare(sa, sb)
    n, delta = min(len(sa), len(sb)), claim.predicate.get("delta")
    chosen = (
        f"each seed's sensitivity over its {claim.tune} grid, "
        if by
        else "each arm at its best value over its seeds, "
        if grid(a, claim.tune)
        else ""
    )
    base.update(estimate=c.diff, test=f"difference of means, {chosen}{c.method}", spread=seed_sd(c, n))
    edge = _join(edge_a, edge_b)
    want = 1 if (claim.kind == "worse") != (claim.metric in HIGHER_IS_BETTER) else -1
    if not c.se > 0:  # identical differences: the exact test decides, and there is no interval
        significant, p, note = no_spread(sa, sb, alpha)
        base.update(p=p, test=f"{base['test']}; exact sign-flip test")
        if significant and not edge and claim.kind in ("better", "worse"):
            word = "reproduced" if want * c.diff > 0 else "not reproduced"
            return Outcome(word, reason=note, **base)
        return _inconclusive(_join(note, edge), **base)
    if claim.kind in ("equivalent", "not_worse"):
        low, high = interval(c, 2 * alpha)
        base.update(low=low, high=high, level=f"{100 * (1 - 2 * alpha):.3g}%")
        if claim.kind == "equivalent":
            p_in = tost_p(c.diff, c.se, c.df, delta)
            base.update(
                p=min(p_in, outside_p(c.diff, c.se, c.df, delta)),
                test=f"two one-sided tests at ±{delta:g}, {c.method}",
            )
            base["level"] += f" (TOST, ±{delta:g})"
            if low > delta or high < -delta:
                return _settled("not reproduced", f"the difference exceeds ±{delta:g}", edge, **base)
            if p_in < alpha and not edge:
                return Outcome("reproduced", **base)
            # inside the margin: the seeds to show it inside; beyond it: the seeds to show it beyond
            needed = seeds_needed(seed_sd(c, n), abs(delta - abs(c.diff)), alpha, sides=1)
            return _inconclusive(_join(edge, needed), **base)
        # not_worse: how much worse a is, -want * (a - b), at most delta; one-sided at alpha
        worse_by = -want * c.diff
        # the claim's one-sided test, or the other one (worse by more than delta): whichever decides
        base["p"] = float(
            min(stats.t.cdf((worse_by - delta) / c.se, c.df), stats.t.sf((worse_by - delta) / c.se, c.df))
        )
        base["test"] = f"non-inferiority at {delta:g}, one-sided at {alpha:.3g}, {c.method}"
        base["level"] += " (one-sided bound)"
        worst, least = max(-want * low, -want * high), min(-want * low, -want * high)
        if least > delta:
            return _settled("not reproduced", f"a is worse by more than {delta:g}", edge, **base)
        if worst < delta and not edge:
            return Outcome("reproduced", **base)
        return _inconclusive(
            _join(edge, seeds_needed(seed_sd(c, n), abs(delta - worse_by), alpha, sides=1)), **base
        )
    # better / worse: the sign of a - b that is an improvement for a
    low, high = interval(c, alpha)
    base.update(low=low, high=high, level=f"{100 * (1 - alpha):.3g}%")
    base["p"] = t_p(c.diff, c.se, c.df)  # two-sided: it decides either word
    if want * low < 0 and want * high < 0:
        return _settled("not reproduced", "the difference is significant the other way", edge, **base)
    if want * low > 0 and want * high > 0 and not edge:
        return Outcome("reproduced", **base)
    if delta is not None and tost_p(c.diff, c.se, c.df, delta) < alpha and not edge:
        effect = claim.predicate.get("effect")
        within = f"equivalent within ±{delta:g} (two one-sided tests)"
        if effect is not None and delta < effect:
            base["p"] = tost_p(c.diff, c.se, c.df, delta)  # the test that decides it
            return Outcome("not reproduced", reason=f"{within}, smaller than the claimed {effect:g}", **base)
        claimed = (
            f"the claimed effect {effect:g}" if effect is not None else "an effect the source does not size"
        )
        return _inconclusive(f"{within}, but a margin not smaller than {claimed} cannot refute it", **base)
    needed = seeds_needed(seed_sd(c, n), abs(c.diff), alpha)
    return _inconclusive(_join(edge, _as_the_report_reads(c, low, high, alpha), needed), **base)


def _as_the_report_reads(c: Comparison, low: float, high: float, alpha: float) -> str:
    """Why a claim inconclusive at its level differs from ``normbench report`` on the same runs (the
    same arms' values and seeds, a 95% interval): where the report's interval excludes 0 and the
    claim's, at a stricter level, does not. Empty where they agree."""
    if c.ci is None or c.tied or alpha >= ALPHA or not low <= 0.0 <= high:
        return ""
    return (
        f"normbench report reads a difference in these runs (its 95% interval of a - b, "
        f"[{c.ci.low:+.3g}, {c.ci.high:+.3g}], excludes 0); at this claim's level, "
        f"{100 * (1 - alpha):.3g}% (its family's), the interval [{low:+.3g}, {high:+.3g}] includes 0"
    )


def _slope(claim: Claim, d: ReportData, runs_a: pd.DataFrame, runs_b: pd.DataFrame, alpha: float):
    """(the least-squares fit over the sizes, its Comparison, sizes used, sizes in all, min seeds, edge,
    each size's (size, value, standard error, degrees of freedom))."""
    p, axis = claim.predicate, claim.predicate["axis"]
    sizes = sorted(pd.to_numeric(pd.concat([runs_a[axis], runs_b[axis]])).dropna().unique())
    x, gap, se, df, ns, edges = [], [], [], [], [], []
    step = log2_step(runs_a, claim.tune)
    for size in sizes:
        sa_runs = runs_a[matches(runs_a[axis], float(size))]
        if p["of"] == "gap":
            sb_runs = runs_b[matches(runs_b[axis], float(size))]
            (ra, ea), (rb, eb) = at_best(sa_runs, claim.tune, "a"), at_best(sb_runs, claim.tune, "b")
            sa, sb = samples(ra, claim.metric, claim.log), samples(rb, claim.metric, claim.log)
            if min(len(sa), len(sb)) < claim.min_seeds:
                continue
            c = compare(sa, sb)
            gap_i, se_i, df_i, n_i = c.diff, c.se, c.df, min(len(sa), len(sb))
            edges += [f"at {axis}={size:g} {e}" for e in (ea, eb) if e]
        else:
            logs = list(per_seed_best(sa_runs, claim.tune).values())
            if len(logs) < claim.min_seeds:
                continue
            n_i = len(logs)
            # a best value read off the grid carries its rounding: step / sqrt(12) per seed
            sd = max(float(np.std(logs, ddof=1)), step / math.sqrt(12))
            gap_i, se_i, df_i = float(np.mean(logs)), sd / math.sqrt(n_i), n_i - 1.0
            _, e = at_best(sa_runs, claim.tune, "the arm")
            edges += [f"at {axis}={size:g} {e}"] if e else []
        x.append(size), gap.append(gap_i), se.append(se_i), df.append(df_i), ns.append(n_i)
    points = list(zip(x, gap, se, df))
    if len(x) < 2:
        return None, None, len(x), len(sizes), min(ns, default=0), _join(*edges), points
    fit = fit_trend(x, gap, se, df)
    t95 = stats.t.ppf(1 - ALPHA / 2, fit.df)
    slope_se = (fit.high - fit.slope) / t95 if fit.high > fit.slope else 0.0
    c = Comparison(fit.slope, None, math.nan, paired=False, se=slope_se, df=fit.df)
    return fit, c, len(x), len(sizes), min(ns), _join(*edges), points


def _every_step(points: list, want: int, alpha: float, axis: str) -> tuple[float, str]:
    """Whether the value moves ``want`` (+1 up, -1 down) at every step between adjacent sizes: an
    intersection-union test, its p the largest of the steps' (each a Welch t test of one size against the
    next), which needs no correction across the steps. (p, the first step that does not, in words)."""
    worst, said = 0.0, ""
    for (x0, g0, s0, d0), (x1, g1, s1, d1) in itertools.pairwise(points):
        step, se = g1 - g0, math.hypot(s0, s1)
        dof = se**4 / (s0**4 / d0 + s1**4 / d1) if s0 > 0 and s1 > 0 else max(min(d0, d1), 1.0)
        p = t_p(step, se, dof) if want * step > 0 else 1.0
        if p > worst:
            worst = p
        if p >= alpha and not said:
            said = f"from {axis}={x0:g} to {x1:g} it moves {step:+.3g} (p {p:.2g})"
    return worst, said


def _trend(claim: Claim, d: ReportData, alpha: float) -> Outcome:
    p = claim.predicate
    axis, runs_a = p["axis"], arm(d.runs, claim.a)
    runs_b = arm(d.runs, claim.b) if claim.b is not None else runs_a.iloc[:0]
    if axis not in d.runs:
        return _inconclusive(f"the runs do not vary {axis}")
    if reason := _several(d, {"a": runs_a, "b": runs_b}, [axis, claim.tune]):
        return _inconclusive(reason)
    gap = p["of"] == "gap"
    fit, c, used, total, n, edge, points = _slope(claim, d, runs_a, runs_b if gap else runs_a.iloc[:0], alpha)
    unit = "slope of " + ("a - b" if gap else f"log2 best {claim.tune}") + f" per doubling of {axis}"
    base = dict(unit=unit, n_a=n, n_b=n if gap else 0, runs=[*runs_a["run_dir"], *runs_b["run_dir"]])
    if fit is None:
        return _inconclusive(
            f"{used} of {total} sizes of {axis} with min_seeds {claim.min_seeds} seeds per arm: "
            "a trend needs 2",
            **base,
        )
    floor = " (grid resolution floored)" if not gap else ""
    base.update(estimate=fit.slope, test=f"least squares over {used} sizes ({fit.method}){floor}, t interval")
    if not c.se > 0:
        return _inconclusive("the sizes show no spread at all: no interval; more seeds or sizes", **base)
    flat = p["direction"] == "flat"
    if flat and fit.lack_of_fit_p < alpha:  # flat across sizes only where they lie along a line
        low, high = interval(c, alpha)
        base.update(low=low, high=high, p=t_p(fit.slope, c.se, fit.df), level=f"{100 * (1 - alpha):.3g}%")
        return _inconclusive(
            f"the sizes scatter about the line more than their seeds explain (lack-of-fit p "
            f"{fit.lack_of_fit_p:.2g}): the trend is not a line in log2({axis})",
            **base,
        )
    if p["direction"] == "flat":
        delta = p["delta"]
        low, high = interval(c, 2 * alpha)
        p_in = tost_p(fit.slope, c.se, fit.df, delta)
        base.update(low=low, high=high, p=min(p_in, outside_p(fit.slope, c.se, fit.df, delta)))
        base["level"] = f"{100 * (1 - 2 * alpha):.3g}% (TOST, ±{delta:g})"
        if low > delta or high < -delta:
            return _settled("not reproduced", f"the slope exceeds ±{delta:g}", edge, **base)
        if p_in >= alpha or edge:
            return _inconclusive(
                _join(edge, f"the slope's interval is wider than ±{delta:g}: more seeds or sizes"), **base
            )
        if not gap and claim.b is not None:  # the control must be seen to move on the same grid
            control, cc, *_ = _slope(claim, d, runs_b, runs_b.iloc[:0], alpha)
            if control is None or not cc.se > 0:
                return _inconclusive("the control arm b has too few sizes or seeds to show its slope", **base)
            c_low, c_high = interval(cc, 2 * alpha)
            moves = c_low > delta or c_high < -delta
            said = f"control b's slope {control.slope:+.2f} [{c_low:+.2f}, {c_high:+.2f}]"
            if not moves:
                return _inconclusive(
                    f"{said} is not outside ±{delta:g} either: on this grid a flat best value cannot be "
                    "told from a best value that would move without the method; wider sizes or a finer grid",
                    **base,
                )
            return Outcome("reproduced", reason=f"{said} moves", **base)
        return Outcome("reproduced", **base)
    # A direction ("grows", "shrinks") holds where the value moves that way at every step between adjacent
    # sizes, whatever their shape; it is refuted where the slope across them is significant the other way.
    want = 1 if p["direction"] == "increasing" else -1
    low, high = interval(c, alpha)
    base.update(low=low, high=high, p=t_p(fit.slope, c.se, fit.df))
    base["level"] = f"{100 * (1 - alpha):.3g}%"
    base["test"] += f"; {p['direction']} at every step between adjacent sizes (intersection-union t tests)"
    if want * low < 0 and want * high < 0:
        return _settled("not reproduced", "the slope is significant the other way", edge, **base)
    steps_p, stuck = _every_step(points, want, alpha, axis)
    if not stuck and not edge:
        base["p"] = steps_p
        return Outcome("reproduced", **base)
    return _inconclusive(
        _join(edge, f"it is not {p['direction']} at every step: {stuck}" if stuck else ""), **base
    )


def _rate(claim: Claim, d: ReportData, alpha: float) -> Outcome:
    a, b = arm(d.runs, claim.a), arm(d.runs, claim.b)
    finished = ("completed", "diverged")
    a, b = a[a["status"].isin(finished)], b[b["status"].isin(finished)]
    # Unstable as stable_lr reads it: a run stuck at the uniform loss failed as surely as one whose
    # loss ran off to infinity, though only the second stops as diverged.
    da, db = int((~_stable(a)).sum()), int((~_stable(b)).sum())
    table = [[da, len(a) - da], [db, len(b) - db]]
    more = claim.predicate["direction"] == "more"
    base = dict(n_a=len(a), n_b=len(b), unit="unstable share, a - b", runs=[*a["run_dir"], *b["run_dir"]])
    if reason := _too_few(claim, len(a), len(b), "finished runs"):
        return _inconclusive(reason, **base)
    side, other = ("greater", "less") if more else ("less", "greater")
    p_claim = float(stats.fisher_exact(table, alternative=side).pvalue)
    p_other = float(stats.fisher_exact(table, alternative=other).pvalue)
    base.update(
        estimate=da / len(a) - db / len(b),
        p=min(p_claim, p_other),
        test=f"Fisher's exact test, one-sided ({da}/{len(a)} vs {db}/{len(b)} unstable)",
    )
    if p_claim < alpha:
        return Outcome("reproduced", **base)
    if p_other < alpha:
        return Outcome("not reproduced", reason="significantly the other way", **base)
    if da == db == 0:
        return _inconclusive(
            "no run was unstable in either arm: a higher learning rate or more depth", **base
        )
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
    a, edge_a = at_best(arm(d.runs, claim.a), claim.tune, "a")
    b, edge_b = at_best(arm(d.runs, claim.b), claim.tune, "b")
    a, b = (r[r["status"].eq("completed")] for r in (a, b))
    base = dict(
        n_a=len(a),
        n_b=len(b),
        unit="steps ratio a/b to the baseline's final loss",
        runs=[*a["run_dir"], *b["run_dir"]],
    )
    if reason := _several(d, {"a": a, "b": b}, []) or _too_few(claim, len(a), len(b)):
        return _inconclusive(reason, **base)
    # per seed, the target is the baseline's own final loss on that seed: b reaches it by its end
    targets = dict(zip(b["seed"], pd.to_numeric(b["final_val_loss"], errors="coerce")))
    logs, censored, spacing = {"a": {}, "b": {}}, {"a": 0, "b": 0}, []
    for side, runs in (("a", a), ("b", b)):
        for run, row in runs.iterrows():
            target = targets.get(row["seed"], math.nan)
            if not math.isfinite(target):
                continue
            steps, reached = steps_to(d.evals, run, target)
            evals = np.sort(d.evals.loc[d.evals["run"].eq(run) & d.evals["step"].gt(0), "step"].unique())
            gap = float(np.diff(evals)[-1]) if len(evals) > 1 else steps
            if not reached:  # never within the run: at least one evaluation past its last (a bound)
                censored[side] += 1
                steps += gap
            if steps > 0:
                logs[side][row["seed"]] = math.log(steps)
                earlier = evals[evals < steps]
                spacing.append(math.log(steps / earlier[-1]) if len(earlier) else math.log(2.0))
    n = min(len(logs["a"]), len(logs["b"]))
    c = compare(logs["a"], logs["b"])
    if c.ci is None:
        return _inconclusive("fewer than 2 seeds a side with an evaluated step", **base)
    c = floored(c, n, float(np.median(spacing)))  # a step is read at the evaluations: their spacing
    low, high = interval(c, alpha)
    bound = math.log(claim.predicate["below"])
    p_exact = exact_p(logs["a"], logs["b"], shift=bound, side=0)
    base.update(
        estimate=math.exp(c.diff),
        low=math.exp(low),
        high=math.exp(high),
        level=f"{100 * (1 - alpha):.3g}%",
        p=max(t_p(c.diff - bound, c.se, c.df), p_exact),
        test=f"log steps to each seed's baseline final loss, {c.method}, "
        "floored at the evaluations' spacing; exact sign-flip test",
        spread=seed_sd(c, n),
    )
    notes = [
        f"{k} run(s) of {s} never reached it (read one evaluation past their last step, a lower bound)"
        for s, k in censored.items()
        if k
    ]
    # a measure some runs never reached is censored: the ratio is a bound, said where it is reported
    if censored["a"] and not censored["b"]:
        base["unit"] += ", censored: at least this (a lower bound)"
    elif censored["b"] and not censored["a"]:
        base["unit"] += ", censored: at most this (an upper bound)"
    elif censored["a"] and censored["b"]:
        base["unit"] += ", censored in both arms: neither an estimate nor a bound"
    edge = _join(edge_a, edge_b)
    # a's censored steps are lower bounds (its ratio is higher still): it cannot read "below"; b's
    # censored steps make the ratio an upper bound: it cannot read "above"
    significant = p_exact < alpha
    if high < bound and significant and not censored["a"] and not edge:
        return Outcome("reproduced", reason=_join(*notes), **base)
    if low > bound and significant and not censored["b"]:
        reason = _join(f"a needs more than {claim.predicate['below']:g}x b's steps", *notes)
        return _settled("not reproduced", reason, edge, **base)
    if not significant and (high < bound or low > bound):
        return _inconclusive(_join(exact_floor(p_exact, n, alpha), *notes, edge), **base)
    return _inconclusive(_join(edge, *notes, seeds_needed(seed_sd(c, n), abs(c.diff - bound), alpha)), **base)


def _stable(runs: pd.DataFrame) -> pd.Series:
    """Whether each finished run stayed stable: completed with a finite final loss at most
    STABLE_FRACTION of its own loss at init (one stuck near its start did not learn)."""
    final = pd.to_numeric(runs["final_val_loss"], errors="coerce")
    init = pd.to_numeric(runs["init_val_loss"], errors="coerce")
    learned = final.le(STABLE_FRACTION * init) | init.isna()
    return runs["status"].eq("completed") & np.isfinite(final) & learned


def _stable_lr(claim: Claim, d: ReportData, alpha: float) -> Outcome:
    key, factor = claim.tune, claim.predicate["factor"]
    sides, top, below, failed = {}, {}, {}, 0
    for side, spec in (("a", claim.a), ("b", claim.b)):
        runs = arm(d.runs, spec)
        failed += int(runs["status"].eq("failed").sum())
        runs = runs[runs["status"].isin(("completed", "diverged"))]
        values = pd.to_numeric(runs[key], errors="coerce") if key in runs else pd.Series(dtype=float)
        ok = runs[_stable(runs)]
        stable = ok.assign(_v=values[ok.index]).groupby("seed")["_v"].max()
        # a seed whose run above its largest stable value failed: where it stops being stable is unknown
        crashed = arm(d.runs, spec).pipe(lambda r: r[r["status"].eq("failed")])
        crashed = pd.to_numeric(crashed[key], errors="coerce").groupby(crashed["seed"]).max()
        sides[side] = {s: math.log2(v) for s, v in stable.items() if not crashed.get(s, -math.inf) > v}
        top[side] = values.max() if len(values) else math.nan
        # a seed unstable at every rate it ran: its largest stable rate lies below the grid, read one
        # grid step below its smallest (a bound: its true rate may be lower still)
        never = sorted(set(runs["seed"]) - set(stable.index) - set(crashed.index))
        floor = math.log2(values.min()) - log2_step(runs, key) if len(values) else math.nan
        sides[side].update(dict.fromkeys(never, floor))
        below[side] = len(never)
    left_out = (
        f"{failed} failed run(s) left out (not a divergence; a seed whose failure hides its limit too)"
        if failed
        else ""
    )
    base = dict(n_a=len(sides["a"]), n_b=len(sides["b"]), unit=f"largest stable {key}, ratio a/b")
    base["runs"] = [*arm(d.runs, claim.a)["run_dir"], *arm(d.runs, claim.b)["run_dir"]]
    arms = {"a": arm(d.runs, claim.a), "b": arm(d.runs, claim.b)}
    if reason := _several(d, arms, [key]) or _too_few(
        claim, len(sides["a"]), len(sides["b"]), "seeds with a stable run"
    ):
        return _inconclusive(_join(reason, left_out), **base)
    n = min(len(sides["a"]), len(sides["b"]))
    c = floored(compare(sides["a"], sides["b"]), n, log2_step(pd.concat(arms.values()), key))
    low, high = interval(c, alpha)
    bound = math.log2(factor)
    p_up, p_down = exact_p(sides["a"], sides["b"], bound, +1), exact_p(sides["a"], sides["b"], bound, -1)
    base.update(
        estimate=2**c.diff,
        low=2**low,
        high=2**high,
        level=f"{100 * (1 - alpha):.3g}%",
        p=min(1.0, max(t_p(c.diff - bound, c.se, c.df), 2 * min(p_up, p_down))),
        test=f"log2 largest stable {key} per seed, {c.method}, floored at the grid's step; "
        "exact sign-flip test",
        spread=seed_sd(c, n),
    )
    # An arm that never went unstable is censored at the grid's top: its true rate is higher still. So
    # a censored b makes the ratio an upper bound (only "not reproduced" can be read), a censored a a
    # lower bound (only "reproduced").
    # A seed below the grid is censored the other way: a's makes the ratio an upper bound, b's a lower one.
    censored = {side: all(v == math.log2(top[side]) for v in sides[side].values()) for side in sides}
    if all(below[side] == len(sides[side]) for side in sides):  # nothing learned anywhere on the grid
        low_end = min(float(pd.to_numeric(arms[side][key], errors="coerce").min()) for side in arms)
        base.update(estimate=math.nan, low=math.nan, high=math.nan, p=math.nan)  # no rate to compare
        return _inconclusive(
            _join(
                f"every seed of both arms was unstable at every rate from {key}={low_end:g}: "
                "extend the grid below it",
                left_out,
            ),
            **base,
        )
    if below["a"] or below["b"]:
        which = ", ".join(f"{k} seed(s) of {side}" for side, k in below.items() if k)
        left_out = _join(f"{which} unstable at every rate, read one grid step below it (a bound)", left_out)
    if low >= bound - 1e-12 and 2 * p_up < alpha and not censored["b"] and not below["a"]:
        return Outcome("reproduced", reason=left_out, **base)
    if high < bound and 2 * p_down < alpha and not censored["a"] and not below["b"]:
        return Outcome(
            "not reproduced",
            reason=_join(f"a's largest stable {key} is below {factor:g}x b's", left_out),
            **base,
        )
    if censored["a"] or censored["b"]:
        which = " and ".join(side for side in ("a", "b") if censored[side])
        return _inconclusive(
            _join(f"{which} never went unstable up to {key}={max(top.values()):g}: widen the grid", left_out),
            **base,
        )
    if low >= bound - 1e-12 or high < bound:
        p = 2 * min(p_up, p_down)
        return _inconclusive(_join(exact_floor(p, n, alpha), left_out), **base)
    return _inconclusive(_join(seeds_needed(seed_sd(c, n), abs(c.diff - bound), alpha), left_out), **base)


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
    """The claim's verdict from its runs ``d`` at family level ``alpha``; a failed run of its arms (an
    error, not a result: read by no predicate), and a run it read that completed without learning
    (normbench.report.load.did_not_learn), are named in its reason."""
    outcome = PREDICATES[claim.kind](claim, d, alpha)
    if claim.kind == "stable_lr":  # it names its failed runs itself, with the seeds whose limit they hide
        return outcome
    arms = pd.concat([arm(d.runs, spec) for spec in (claim.a, claim.b) if spec is not None])
    failed = failed_note(arms, f"normbench claims run {claim.id} --retry-failed")
    used = d.runs[d.runs["run_dir"].isin(outcome.runs)]
    outcome.reason = _join(outcome.reason, failed, _unlearned(claim, used))
    return outcome


def _unlearned(claim: Claim, used: pd.DataFrame) -> str:
    """'7 of its runs did not learn (norm=bn: 7 of 7; ...)': by arm, since a treatment that makes a
    run stop learning (BatchNorm's leak, which lowers its train loss alone) reads differently from
    both arms stuck."""
    if "did_not_learn" not in used or not used["did_not_learn"].eq(True).any():
        return ""
    counts = []
    for spec in (claim.a, claim.b):
        if spec is None:
            continue
        runs = arm(used, spec)
        if stuck := int(runs["did_not_learn"].eq(True).sum()):
            counts.append(f"{', '.join(f'{k}={v}' for k, v in spec.items())}: {stuck} of {len(runs)}")
    total = int(used["did_not_learn"].eq(True).sum())
    below = (
        f"ended at or above {LEARNED_FRACTION:.0%} of their loss at init, or less than {LEARN_MARGIN} "
        "below their unigram loss"
    )
    return f"{total} of its runs did not learn ({'; '.join(counts)}; {below})"

"""A claim's two stages: the pilot that fixes its design, and the confirmation that decides it.

``normbench claims preregister ID`` reads the claim's pilot (its runs in the claims' folder, OUT/ID/,
on seeds of their own): each arm's best value of the tuned key over all its pilot seeds, the paired
difference's distance from the bound the claim is tested against, and the spread of a seed's
difference. From them normbench.claims.power fixes the confirmation's seed count at the level the
claim's family gives it (Holm's first level across the registry's claims, or across the user's own:
normbench.claims.families), and the design is written to prereg.yaml (normbench.claims.prereg)
before anything of the confirmation runs. A design over the budget is written all the same, with a
warning that gives its runs and time.

``normbench claims confirm ID`` runs the pre-registered design: fresh seeds (disjoint from the
pilot's), each arm at its fixed value, paired by seed. Its verdict (``decide``) uses the
confirmation's runs alone, each arm at its fixed value, with:

- a one-sided test where the claim has a direction (better, worse, fewer steps, a higher stable
  rate, a growing or shrinking trend) at its level: the claimed side reads reproduced, the opposite
  side (one-sided at the same level) reads not reproduced: the refutation named in advance;
- equivalence and non-inferiority as their two one-sided tests at their margin;
- fewer completed seeds than planned: inconclusive (a confirmation is never cut short or extended
  after a look at its verdict).

A claim pre-registered whose confirmation has not run reads inconclusive, with its pilot's word as
information only; a claim whose treatment never engages in its runs reads "not testable at this
scale" (normbench.claims.engagement). Neither enters the Holm family (no p).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import pandas as pd
from rich.console import Console

from normbench.claims import engagement, power, prereg
from normbench.claims.arms import arm, at_best, learned, log2_step, matches
from normbench.claims.predicates import Outcome, judge
from normbench.claims.schema import EXACT, Claim
from normbench.claims.smallsample import ALPHA
from normbench.core.errors import ConfigError
from normbench.report.load import ReportData
from normbench.report.metrics import HIGHER_IS_BETTER
from normbench.report.tuning import at_best_value

PLANNED = ("better", "worse", "equivalent", "not_worse", "steps_to_target", "stable_lr")
NOT_TESTABLE = "not testable at this scale"


def one_sided(claim: Claim) -> bool:
    """Whether the claim has a direction: its confirmation is one-sided."""
    if claim.kind == "trend":
        return claim.predicate["direction"] != "flat"
    return claim.kind in ("better", "worse", "steps_to_target", "stable_lr", "rate")


def _improves(claim: Claim) -> int:
    """The sign of a - b that the claim says: -1 where a lower value is claimed (a better loss)."""
    return 1 if (claim.kind == "worse") != (claim.metric in HIGHER_IS_BETTER) else -1


def bound_and_direction(claim: Claim) -> tuple[float, str]:
    """(the bound on the difference's scale that the test is against, what reads which word)."""
    p, kind = claim.predicate, claim.kind
    if kind in ("better", "worse"):
        side = "<" if _improves(claim) < 0 else ">"
        other = ">" if side == "<" else "<"
        return 0.0, f"reproduced: a - b {side} 0 one-sided; not reproduced: a - b {other} 0 one-sided"
    if kind == "equivalent":
        d = p["delta"]
        return d, f"reproduced: |a - b| < {d:g} (TOST); not reproduced: |a - b| > {d:g} one-sided"
    if kind == "not_worse":
        d = p["delta"]
        return d, f"reproduced: a worse by less than {d:g}; not reproduced: a worse by more than {d:g}"
    if kind == "steps_to_target":
        b = p["below"]
        return math.log(b), f"reproduced: steps ratio a/b < {b:g} one-sided; not reproduced: > {b:g}"
    f = p["factor"]
    return math.log2(f), f"reproduced: stable-rate ratio a/b >= {f:g} one-sided; not reproduced: < {f:g}"


def distance(claim: Claim, outcome: Outcome) -> float:
    """The pilot estimate's distance from the bound, on the scale its spread is measured in."""
    bound, _ = bound_and_direction(claim)
    est = outcome.estimate
    if claim.kind == "steps_to_target":
        return abs(math.log(est) - bound)
    if claim.kind == "stable_lr":
        return abs(math.log2(est) - bound)
    if claim.kind == "equivalent":
        return abs(bound - abs(est))
    if claim.kind == "not_worse":
        return abs(-_improves(claim) * est - bound)
    return abs(est)


def _best_values(claim: Claim, d: ReportData) -> dict:
    """Each arm's value of the tuned key, best (lowest mean final loss) over all its pilot seeds."""
    if not claim.tune or claim.kind == "stable_lr":
        return {}
    values = {}
    for side, spec in (("a", claim.a), ("b", claim.b)):
        runs = arm(d.runs, spec)
        _, best = at_best_value(runs, claim.tune, learned(runs))
        values[side] = float(best)
    return values


def _at_an_edge(claim: Claim, d: ReportData) -> str | None:
    """Which arm's best value of the tuned key is at its grid's edge, if one is: where that arm may do
    better off the grid."""
    if not claim.tune or claim.kind == "stable_lr":
        return None
    for side, spec in (("a", claim.a), ("b", claim.b)):
        if edge := at_best(arm(d.runs, spec), claim.tune, side)[1]:
            return edge
    return None


def design(claim: Claim, d: ReportData, family: int, commit: str = "") -> prereg.Prereg:
    """The confirmation's design from the pilot's runs ``d``; ConfigError, one line, when the claim
    cannot be planned."""
    planned = plan(claim, d, family, commit)
    if isinstance(planned, str):
        raise ConfigError(f"{claim.id}: {planned}")
    return planned


def plan(claim: Claim, d: ReportData, family: int, commit: str = "") -> prereg.Prereg | str:
    """The confirmation's design from the pilot's runs ``d``, or why the claim cannot be planned (no
    spread measured, a kind without a planned test, no seed count reaching the power). A design over
    the budget is planned all the same: ``over_budget`` says what it costs."""
    if claim.kind not in PLANNED:
        return f"a {claim.kind} claim is not planned by a paired test; allowed: {', '.join(PLANNED)}"
    if why := engagement.not_engaged(claim, d):
        return f"{NOT_TESTABLE}: {why}"
    # The pilot is read for its estimate and spread, not decided: min_seeds gates a verdict, not a plan
    # (three seeds of a stable_lr pilot measure the edges a confirmation of more is planned from).
    outcome = judge(dataclasses.replace(claim, min_seeds=2), d, ALPHA)
    level = power.family_level(family)
    n_pilot = min(outcome.n_a, outcome.n_b)
    far = distance(claim, outcome) if math.isfinite(outcome.estimate) else math.nan
    if not math.isfinite(outcome.spread) or not math.isfinite(far) or n_pilot < 2:
        return f"the pilot measures no spread to plan from ({outcome.reason})"
    step = log2_step(pd.concat([arm(d.runs, claim.a), arm(d.runs, claim.b)]), claim.tune)
    if claim.kind == "stable_lr" and outcome.spread <= step / math.sqrt(6) + 1e-12:
        n, planned_sd = power.resolution_seeds(far, step, level), outcome.spread  # the grid's floor alone
    else:
        exact = claim.kind in EXACT
        n, planned_sd = power.planned_seeds(far, outcome.spread, n_pilot - 1, level, exact=exact)
    values = _best_values(claim, d)
    if edge := _at_an_edge(claim, d):
        return (
            f"{edge}: a confirmation fixed there may not hold that arm at its best (a new grid is a new rule)"
        )
    if n is None:
        return (
            f"no seed count up to 1000 reaches 80% power at level {level:.3g} for the pilot's distance "
            f"{far:.3g} at spread {planned_sd:.3g} (its upper {power.PLAN_CONFIDENCE:.0%} bound)"
        )
    n = max(n, claim.min_seeds)
    bound, direction = bound_and_direction(claim)
    pilot_seeds = sorted({int(s) for s in pd.concat([arm(d.runs, claim.a), arm(d.runs, claim.b)])["seed"]})
    first = max(prereg.SEED_BASE, max(pilot_seeds, default=-1) + 1)  # fresh: above every pilot seed
    seeds = list(range(first, first + n))
    sides = "one-sided" if one_sided(claim) else "two one-sided tests"
    return prereg.Prereg(
        id=claim.id,
        claim_sha=prereg.fingerprint(claim.path),
        family=family,
        level=float(level),
        test=f"{claim.kind}, {sides} at the Holm level of its rank (at most {level:.3g} planned)",
        direction=direction,
        margin=float(bound),
        planned_n=int(n),
        seeds=seeds,
        values=values,
        pilot={
            "seeds": pilot_seeds,
            "key": claim.tune,
            "estimate": float(outcome.estimate),
            "spread": float(outcome.spread),
            "spread_planned": float(planned_sd),
            "distance": float(far),
            "commit": commit,
            "written": time.strftime("%Y-%m-%d", time.gmtime()),
        },
    )


def confirmation_args(claim: Claim, seeds: list[int], values: dict) -> list[str]:
    """The overrides that run a design: the confirmation's seeds, and the arms' fixed values (both
    values run in one sweep; each arm is read at its own)."""
    args = [f"seed={','.join(str(s) for s in seeds)}"]
    if values:
        args.append(f"{claim.tune}={','.join(f'{v:g}' for v in sorted(set(values.values())))}")
    return args


def confirmation_cost(
    claim: Claim, n: int, values: dict, per_run: float | None = None
) -> tuple[int, float | None]:
    """(the runs of a confirmation of ``n`` seeds per arm, its seconds at ``per_run`` seconds a run, by
    default the claim's measured cost per run: cost_s over its default sweep's runs; None without one)."""
    runs = claim.runs(confirmation_args(claim, list(range(n)), values))
    if per_run is None and claim.cost_s:
        per_run = claim.cost_s / claim.runs()
    return runs, (per_run * runs if per_run is not None else None)


def over_budget(claim: Claim, n: int, values: dict, per_run: float | None = None) -> str:
    """A warning where a confirmation of ``n`` seeds per arm would outlast the budget (empty within it):
    power.BUDGET_S seconds at ``per_run`` seconds a run (default: the claim's measured cost), or
    without a cost power.BUDGET_SEEDS seeds per arm. It is planned all the same: whether its time is
    worth spending is the person's call, made knowing the time."""
    runs, seconds = confirmation_cost(claim, n, values, per_run)
    if seconds is None:
        if n <= power.BUDGET_SEEDS:
            return ""
        return f"{n} seeds per arm is over the budget of {power.BUDGET_SEEDS} (its time is not known yet)"
    if seconds <= power.BUDGET_S:
        return ""
    return (
        f"{runs} runs, about {seconds / 60:.0f} min at {seconds / runs:.3g} s a run: over the budget of "
        f"{power.BUDGET_S / 60:.0f} min"
    )


def confirm(
    claim: Claim,
    registry: Path,
    overrides: list[str],
    retry_failed: bool = False,
    dry_run: bool = False,
    console: Console | None = None,
) -> int:
    """Run the claim's pre-registered confirmation into OUT/confirmations/ID/ (resumable), its
    estimated time said before it starts."""
    from normbench.claims.checking import check_claim, claim_args
    from normbench.claims.families import command
    from normbench.claims.running import estimate, runs_to_go, seconds_per_run
    from normbench.sweeps import batching
    from normbench.sweeps.sweep import run_sweep

    console = console or Console()
    design = prereg.read(registry, claim.id)
    if design is None:
        raise ConfigError(f"{claim.id}: not pre-registered: {command('preregister', claim, registry)} first")
    if design.claim_sha != prereg.fingerprint(claim.path):
        raise ConfigError(
            f"{claim.id}: the claim changed since its pre-registration: a new design is a new "
            "pre-registration on fresh seeds"
        )
    fixed = confirmation_args(claim, design.seeds, design.values)
    # the tuned key is pinned to the arms' values (one value where they agree): nothing left to tune
    check_claim(dataclasses.replace(claim, tune=None) if design.values else claim, [*fixed, *overrides])
    out = prereg.folder(registry, claim.id)
    todo = runs_to_go(claim, [*fixed, *overrides], out, retry_failed)
    per_run = seconds_per_run(claim, out, registry / claim.id)
    console.print(f"{claim.id}: confirmation, {estimate(todo, *per_run)}", highlight=False)
    args = [*claim_args(claim, [*fixed, *overrides]), f"hydra.sweep.dir={out.resolve()}"]
    if batching.pays(overrides):
        args.append(batching.OPTION)
    return run_sweep(args, dry_run=dry_run, retry_failed=retry_failed, console=console)


def _fixed(claim: Claim, design: prereg.Prereg, d: ReportData) -> ReportData:
    """The confirmation's runs the design reads: its seeds, each arm at its pre-registered value."""
    runs = d.runs
    keep = pd.Series(False, index=runs.index)
    for side, spec in (("a", claim.a), ("b", claim.b)):
        if spec is None:
            continue
        mask = runs.index.isin(arm(runs, spec).index)
        if side in design.values:
            mask &= matches(runs[claim.tune], design.values[side])
        keep |= mask
    keep &= pd.to_numeric(runs["seed"], errors="coerce").isin(design.seeds)
    return dataclasses.replace(d, runs=runs[keep])


def decide(
    claim: Claim, design: prereg.Prereg | None, d: ReportData, alpha: float, confirmed: bool
) -> Outcome:
    """The claim's outcome at level ``alpha``: from its confirmation's runs ``d`` where ``confirmed``,
    else from its pilot's (inconclusive, with the pilot's word, when pre-registered)."""
    if why := engagement.not_engaged(claim, d):
        return Outcome(NOT_TESTABLE, reason=why, runs=list(d.runs["run_dir"]))
    if design is None:
        return judge(claim, d, alpha)
    if not confirmed:
        pilot = judge(claim, d, alpha)
        return dataclasses.replace(
            pilot,
            verdict="inconclusive",
            p=math.nan,
            reason=f"pre-registered ({design.planned_n} seeds per arm); its confirmation has not run "
            f"(normbench claims confirm {claim.id}); the pilot alone reads {pilot.verdict}",
        )
    if design.claim_sha != prereg.fingerprint(claim.path):
        return Outcome(
            "inconclusive",
            reason="the claim changed since its pre-registration: its confirmation tested another design "
            "(a new pre-registration on fresh seeds decides it)",
            runs=list(d.runs["run_dir"]),
        )
    predicate = claim.predicate
    if claim.kind in ("better", "worse"):  # the refutation named in advance: the opposite direction
        predicate = {k: v for k, v in predicate.items() if k not in ("delta", "effect")}
    tested = dataclasses.replace(claim, min_seeds=design.planned_n, predicate=predicate)
    fixed = _fixed(claim, design, d)
    if not one_sided(claim):
        outcome = judge(tested, fixed, alpha)
    else:  # each end of the interval at 2 alpha is a one-sided bound at alpha
        outcome = judge(tested, fixed, min(2 * alpha, 0.5))
        outcome.p = outcome.p / 2
        outcome.level = f"{100 * (1 - alpha):.3g}% one-sided"
    outcome.test = f"{outcome.test}; pre-registered confirmation, seeds {design.seeds[0]}-{design.seeds[-1]}"
    return outcome


def pilot_runs(claim: Claim, registry: Path) -> ReportData:
    """The pilot's runs: the claim's runs in the registry's folder, of the current numerics."""
    from normbench.claims.families import command
    from normbench.claims.running import sweep_changed
    from normbench.core.provenance import NUMERICS
    from normbench.report.load import NUMERICS as NUMERICS_COLUMN
    from normbench.report.load import find_inputs, load_runs

    folder = registry / claim.id
    run_dirs = find_inputs([folder])[0] if folder.is_dir() else []
    if not run_dirs:
        raise ConfigError(f"{claim.id}: no pilot runs in {folder}: {command('run', claim, registry)}")
    if sweep_changed(claim, folder):  # a pilot of another design plans nothing of this one
        raise ConfigError(
            f"{claim.id}: its pilot in {folder} ran another sweep than the claim's now: "
            f"{command('run', claim, registry)} runs the pilot of this design"
        )
    d = load_runs(run_dirs, lambda message: None)
    d.runs = d.runs[d.runs[NUMERICS_COLUMN].eq(NUMERICS)]
    return d


def preregister(claim: Claim, registry: Path, family: int) -> str:
    """Write the claim's pre-registration from its pilot, and say it: its seeds, values and level, its
    confirmation's estimated time, and a warning where that is over the budget (planned all the same);
    refused once its confirmation has runs."""
    from normbench.claims.families import command
    from normbench.claims.running import estimate, seconds_per_run
    from normbench.core.provenance import git_commit
    from normbench.report.load import find_inputs

    out = prereg.folder(registry, claim.id)
    if out.is_dir() and find_inputs([out])[0]:
        raise ConfigError(
            f"{claim.id}: its confirmation has runs in {out}: a changed design is a new claim on fresh seeds"
        )
    planned = design(claim, pilot_runs(claim, registry), family, commit=git_commit() or "")
    path = prereg.write(registry, planned)
    values = ", ".join(f"{s} at {claim.tune}={v:g}" for s, v in planned.values.items())
    per_run, source = seconds_per_run(claim, registry / claim.id)
    runs, _ = confirmation_cost(claim, planned.planned_n, planned.values)
    said = (
        f"{path}: {planned.planned_n} seeds per arm ({planned.seeds[0]}-{planned.seeds[-1]})"
        + (f", {values}" if values else "")
        + f", level {planned.level:.3g} (Holm across {family}); {planned.direction}\n"
        + f"its confirmation: {estimate(runs, per_run, source)}: {command('confirm', claim, registry)}"
    )
    if over := over_budget(claim, planned.planned_n, planned.values, per_run):
        said += f"\nwarning: {over}"
    return said

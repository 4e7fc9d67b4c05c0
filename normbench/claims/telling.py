"""A claim's verdict in words, one line at the end of every verb that runs or plans it, and what its
confirmation needs after a pilot.

The line names the word, the estimate with its interval, the interval's level and the seeds it rests
on (an interval from two seeds is said to be fragile: its width rests on one difference of two
numbers), what each arm ran with (its tuned value, and its init, tied head and warm-up where they
differ from the other arm's), and the reason. After ``claims run``, a claim not yet pre-registered is
told what its confirmation needs: the seeds for 80% power at its family's level, the runs and their
estimated time, and the commands that plan and run it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from normbench.claims import confirming
from normbench.claims.arms import arm
from normbench.claims.families import command, is_users
from normbench.claims.running import estimate, seconds_per_run, sweep_changed
from normbench.claims.verdicts import Verdict
from normbench.report.load import load_runs
from normbench.report.recipe import differences
from normbench.report.verdict import FEW_SEEDS


def interval_text(v: Verdict) -> str:
    """'a - b +0.5 [+0.48, +0.52] (95%, n = 4 and 4 seeds)', with a warning from two seeds; empty
    without an estimate."""
    o = v.outcome
    if not math.isfinite(o.estimate):
        return ""
    said = f"{o.unit} {o.estimate:+.3g}" if o.unit else f"{o.estimate:+.3g}"
    if math.isfinite(o.low) and math.isfinite(o.high):
        said += f" [{o.low:+.3g}, {o.high:+.3g}] ({o.level}, n = {o.n_a} and {o.n_b} seeds)"
        if min(o.n_a, o.n_b) <= FEW_SEEDS:
            said += f"; warning: an interval from {FEW_SEEDS} seeds is fragile: run more seeds"
    return said


def arms_text(v: Verdict) -> str:
    """'a (norm=rms) train.lr=0.003, init gpt2; b (norm=ln) train.lr=0.01, init bert': each arm's
    tuned value among the runs its verdict read, and its recipe where it differs from the other arm's
    (normbench.report.recipe); empty without runs."""
    claim = v.claim
    run_dirs = [Path(r) for r in dict.fromkeys(v.outcome.runs)]
    if not run_dirs:
        return ""
    runs = load_runs(run_dirs, lambda message: None).runs
    groups = pd.Series("", index=runs.index)
    also = {}
    for side, spec in (("a", claim.a), ("b", claim.b)):
        if spec is None:
            continue
        label = f"{side} ({', '.join(f'{k}={value}' for k, value in spec.items())})"
        chosen = arm(runs, spec)
        groups[chosen.index] = label
        if claim.tune and claim.tune in chosen:
            values = pd.to_numeric(chosen[claim.tune], errors="coerce").dropna().unique()
            also[label] = f"{claim.tune}=" + "/".join(f"{x:g}" for x in sorted(values))
    read = groups.ne("")
    said = differences(runs[read], groups[read], also)
    return "; ".join(f"{label} {text}" if text else label for label, text in said.items())


def verdict_line(v: Verdict) -> str:
    """'ID: WORD: a - b +0.5 [...] (95%, n = 4 and 4 seeds); arms: ...; REASON'."""
    arms = arms_text(v)
    detail = "; ".join(p for p in (interval_text(v), f"arms: {arms}" if arms else "", v.outcome.reason) if p)
    return f"{v.claim.id}: {v.word}" + (f": {detail}" if detail else "")


def next_step(v: Verdict, folder: Path, family: int) -> str:
    """What confirms a claim its pilot (its runs in FOLDER/ID/) has read: the confirmation's seeds for
    80% power at the level of its ``family`` of claims, its runs and their estimated time, and the
    commands; or why none is planned. Empty for a claim pre-registered already, or not run."""
    claim = v.claim
    if v.design is not None or v.word == "not run" or claim.kind not in confirming.PLANNED:
        return ""
    if sweep_changed(claim, v.folder):  # a pilot of another design plans nothing of this one
        again = command("run", claim, folder)
        return f"{claim.id}: no confirmation planned: its runs are of an earlier sweep: {again}"
    planned = confirming.plan(claim, confirming.pilot_runs(claim, v.folder.parent), family)
    if isinstance(planned, str):
        return f"{claim.id}: no confirmation planned: {planned}"
    per_run, source = seconds_per_run(claim, v.folder)
    runs, _ = confirming.confirmation_cost(claim, planned.planned_n, planned.values, per_run)
    whose = "your claims" if is_users(claim) else "the registry's claims"
    said = (
        f"{claim.id}: its confirmation needs {planned.planned_n} seeds per arm for 80% power at level "
        f"{planned.level:.3g} (Holm across {family}: {whose}), on fresh seeds: "
        f"{estimate(runs, per_run, source)}; {command('preregister', claim, folder)} fixes it, "
        f"{command('confirm', claim, folder)} runs it"
    )
    if over := confirming.over_budget(claim, planned.planned_n, planned.values, per_run):
        said += f"; warning: {over}"
    return said

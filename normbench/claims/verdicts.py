"""Verdicts of the registry: each claim's runs found and judged, with provenance, scale and Holm.

A claim's runs are its directory ``DIR/<id>/`` (what ``normbench claims run`` writes), found below
the folders given; a claim without one is ``not run``. Each verdict carries its evidence (n per
arm, the estimate, its interval, the test) and where the runs come from: the provenance blocks of
their summary.json files (normbench.core.provenance.provenance_of; runs stored before provenance
say so), and the date of their summaries. A claim that may depend on scale says at what size
it was measured beside its word. ``holm=True`` corrects across every row of the registry (m, each
claim at each size, run or not): Holm's step-down order by each claim's p-value, each judged at its
level alpha / (m - rank), its interval at that level; a claim after the first one that fails its
level reads neither reproduced nor not reproduced: each claim's p is that of the test deciding its
word, either way. A row without a p (not run, not testable) is never rejected and moves no level.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from normbench.claims import confirming, prereg, rules
from normbench.claims.predicates import Outcome
from normbench.claims.running import recorded_overrides, sweep_changed
from normbench.claims.schema import Claim
from normbench.claims.smallsample import ALPHA
from normbench.core.provenance import NUMERICS, describe, provenance_of
from normbench.core.runs import RunDir
from normbench.report.load import NUMERICS as NUMERICS_COLUMN
from normbench.report.load import find_inputs, load_runs

WORDS = ("reproduced", "not reproduced", confirming.NOT_TESTABLE, "inconclusive", "not run")
COLOURS = {
    "reproduced": "green",
    "not reproduced": "red",
    confirming.NOT_TESTABLE: "blue",
    "inconclusive": "yellow",
    "not run": "bright_black",
}


@dataclass
class Verdict:
    claim: Claim
    outcome: Outcome
    folder: Path | None  # the claim's run directory, None when not run
    params: float = math.nan  # the mean parameter count of the runs judged
    provenance: str = ""
    corrected: bool = False
    family: int = 0  # the rows Holm corrects across, when corrected
    alpha: float = ALPHA
    stale: int = 0  # runs in the folder of other numerics, left out of the verdict
    design: prereg.Prereg | None = None  # the claim's pre-registration, None without one
    rule: dict | None = None  # the rule its pilot ran under and the commits (normbench.claims.rules)
    confirm_commit: str = ""  # the commit(s) its confirmation's runs were trained at
    data: str = ""  # the corpus its runs trained on (data.name)

    @property
    def word(self) -> str:
        return self.outcome.verdict

    @property
    def scale_note(self) -> str:
        """'at 0.1M parameters; the paper's setting is 1.3B' beside a claim that may depend on scale."""
        if not self.claim.scale_dependent or self.word not in ("reproduced", "not reproduced"):
            return ""
        size = f"at {self.params / 1e6:.2g}M parameters" if math.isfinite(self.params) else "at this scale"
        return (
            f"{self.word} {size}; the {self.claim.source['kind']}'s setting is {self.claim.scale_dependent}"
        )


def claim_folder(claim: Claim, folders: list[Path]) -> Path | None:
    """DIR/<id> (or DIR itself when it is named after the claim) holding at least one run."""
    for folder in folders:
        for candidate in (folder / claim.id, folder):
            if candidate.name == claim.id and candidate.is_dir() and find_inputs([candidate])[0]:
                return candidate
    return None


def describe_provenance(run_dirs: list[str]) -> str:
    """'normbench 29939de, torch 2.13.0+cpu, cpu, ln=native, 2026-11-26' over the runs judged."""
    blocks, dates, missing = [], set(), 0
    for run_dir in dict.fromkeys(run_dirs):
        summary = RunDir(Path(run_dir)).read_summary() or {}
        block = provenance_of(summary)
        if not block:  # a run stored before provenance: its env block names the commit, torch and device
            missing += 1
            env = summary.get("env") if isinstance(summary.get("env"), dict) else {}
            block = {"commit": env.get("git_commit"), "torch": env.get("torch"), "device": env.get("device")}
        blocks.append(block)
        if block.get("date"):  # written into the summary: the same on every clone
            dates.add(str(block["date"]))
        elif summary:  # a run stored before the date was: its file's time
            dates.add(
                time.strftime("%Y-%m-%d", time.gmtime((Path(run_dir) / "summary.json").stat().st_mtime))
            )
    if not blocks:
        return ""
    note = f"{missing} of {len(blocks)} runs without provenance (their env read instead)" if missing else ""
    return ", ".join(p for p in (describe(blocks, brief=True), "/".join(sorted(dates)), note) if p)


def assess(
    claim: Claim, folder: Path | None, alpha: float = ALPHA, warn=lambda m: None, family: int | None = None
) -> Verdict:
    """One claim's verdict from its folder (None: not run): from its pre-registered confirmation's runs
    where it has them (normbench.claims.confirming), else from the folder's. An inconclusive claim not
    pre-registered says, given the registry's ``family``, the confirmation that would decide it or why
    none is planned."""
    if folder is None:
        return Verdict(claim, Outcome("not run", reason=f"no runs: normbench claims run {claim.id}"), None)
    rule = rules.read(folder)
    if rules.changed(folder, claim.path):
        reason = (
            f"its rule changed after its pilot began ({folder / rules.FILE}): it decides nothing; "
            "pilot it again on fresh seeds"
        )
        return Verdict(claim, Outcome("inconclusive", reason=reason), folder, rule=rule)
    design = prereg.read(folder.parent, claim.id)
    confirmation = prereg.folder(folder.parent, claim.id)
    confirmed = design is not None and confirmation.is_dir() and bool(find_inputs([confirmation])[0])
    run_dirs, _ = find_inputs([confirmation if confirmed else folder])
    d = load_runs(run_dirs, warn)
    if d.runs.empty:
        return Verdict(claim, Outcome("not run", reason=f"no finished run in {folder}"), folder)
    stale = d.runs[NUMERICS_COLUMN].ne(NUMERICS)
    if stale.all():
        found = ", ".join(str(v) for v in sorted(d.runs[NUMERICS_COLUMN].unique()))
        reason = (
            f"every run is of other numerics ({found}, now {NUMERICS}): "
            f"normbench claims run {claim.id} retrains them"
        )
        return Verdict(claim, Outcome("not run", reason=reason), folder)
    d.runs = d.runs[~stale]
    outcome = confirming.decide(claim, design, d, alpha, confirmed)
    enough = min(outcome.n_a, outcome.n_b) >= claim.min_seeds  # fewer: that is the reason
    if (
        design is None
        and family
        and enough
        and outcome.verdict == "inconclusive"
        and claim.kind in confirming.PLANNED
    ):
        outcome.reason = _plan(claim, d, family, folder)
    if stale.any():  # the report's rule: runs of other numerics are not the same computation
        note = f"{int(stale.sum())} run(s) of other numerics left out (normbench claims run retrains them)"
        outcome.reason = "; ".join(r for r in (outcome.reason, note) if r)
    used = d.runs[d.runs["run_dir"].isin(outcome.runs)]
    params = pd.to_numeric(used["params"], errors="coerce").mean() if "params" in used else math.nan
    provenance = ", ".join(p for p in (describe_provenance(outcome.runs), _changed(claim, folder)) if p)
    data = "/".join(sorted(map(str, used["data.name"].dropna().unique()))) if "data.name" in used else ""
    return Verdict(
        claim,
        outcome,
        folder,
        params,
        provenance,
        alpha=alpha,
        stale=int(stale.sum()),
        design=design,
        rule=rule,
        confirm_commit=_commits(outcome.runs) if confirmed else "",
        data=data,
    )


def _commits(run_dirs: list[str]) -> str:
    """The commits runs were trained at, as their provenance names them ('a1b2c3d', or several joined)."""
    commits = {
        str(provenance_of(RunDir(Path(r)).read_summary() or {}).get("commit") or "")
        for r in dict.fromkeys(run_dirs)
    }
    return "/".join(sorted(c for c in commits if c))


def _plan(claim: Claim, d, family: int, folder: Path) -> str:
    """What would decide a claim its runs leave inconclusive: the confirmation its runs as a pilot plan,
    or why none is (over the budget, a pilot of another sweep)."""
    if sweep_changed(claim, folder):
        return f"its runs are of an earlier sweep: normbench claims run {claim.id} runs its pilot"
    planned = confirming.plan(claim, d, family)
    if isinstance(planned, str):
        return planned
    runs, seconds = confirming.confirmation_cost(claim, planned.planned_n, planned.values)
    cost = f"{runs} runs" + (f", about {seconds / 60:.0f} min" if seconds is not None else "")
    return (
        f"a confirmation of {planned.planned_n} seeds per arm ({cost}) has 80% power at level "
        f"{planned.level:.3g} for the pilot's estimate: normbench claims preregister {claim.id}"
    )


def _changed(claim: Claim, folder: Path) -> str:
    """How the claim's runs differ from the registry's sweep: the user's overrides they were run with
    (overrides.yaml), and a sweep changed since (the claim.yaml ``claims run`` copied beside them); the
    comparison and predicate are read afresh from the registry."""
    notes = [
        f"run with overrides {' '.join(s)}, not the registry's sweep" for s in recorded_overrides(folder)
    ]
    if sweep_changed(claim, folder):
        notes.append(f"the claim's sweep changed since these runs ({folder / 'claim.yaml'})")
    return "; ".join(notes)


def assess_all(
    claims: list[Claim], folders: list[Path], holm: bool = False, warn=lambda m: None, others=()
) -> list[Verdict]:
    """Every claim's verdict, in registry order; with ``holm``, Holm-corrected across all of ``claims``, one
    family (normbench.claims.families: the registry's every row, each claim at each of its sizes, run or
    not, testable or not; or a user's own claims): a fixed family, so running, re-running or
    pre-registering one claim moves no other claim's level. ``others``: claims of another family,
    judged apart: known, not judged."""
    found = {c.id: claim_folder(c, folders) for c in claims}
    known = {*found, *(c.id for c in others)}
    for folder in folders:  # claims run from another config folder: their runs would go unread
        for stored in sorted(folder.glob("*/claim.yaml")):
            if stored.parent.name not in known:
                warn(
                    f"{stored.parent} holds the runs of claim '{stored.parent.name}', not in the registry "
                    "(its YAML is in another --config-dir?)"
                )
    family = len(claims)
    verdicts = [assess(c, found[c.id], ALPHA, warn, family) for c in claims]
    if holm:
        _holm(claims, verdicts, found, warn)
    return verdicts


def _holm(claims: list[Claim], verdicts: list[Verdict], found: dict, warn) -> None:
    """Holm's step-down across one family, ``claims``, their ``verdicts`` replaced in place."""
    family = len(claims)
    judged = [i for i, v in enumerate(verdicts) if v.word != "not run" and math.isfinite(v.outcome.p)]
    order = sorted(judged, key=lambda i: verdicts[i].outcome.p)
    stopped = False
    for rank, i in enumerate(order):
        level = ALPHA / (family - rank)
        v = assess(claims[i], found[claims[i].id], level, warn, family)
        if stopped and v.word in ("reproduced", "not reproduced"):  # Holm stops every rejection after
            v.outcome = dataclasses.replace(
                v.outcome,
                verdict="inconclusive",
                reason=f"Holm: a claim with a smaller p-value was not rejected (alone it reads {v.word})",
            )
        stopped = stopped or v.outcome.p >= level
        verdicts[i] = v
    for v in verdicts:
        v.corrected, v.family = True, family

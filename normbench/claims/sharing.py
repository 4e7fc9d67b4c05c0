"""Runs claims share: a job of a claim's sweep that another claim has already trained, of the very same
config, is copied into the claim's folder instead of trained again.

Claims often run the same arm: LayerNorm under Pre-LN at the same rates and seeds is one arm of
several claims. Each claim's folder keeps its own copy of every run it reads (its records are whole
on their own; git stores an identical file once), and the run is trained once. A run is lent only
when it trained after the borrowing claim's rule was fixed: at a clean commit that descends from the
claim's ``rule_commit`` (normbench.claims.rules), so no run that could have been seen before a rule
was written enters the verdict that rule decides. Outside git, or at commits git cannot order,
nothing is lent. Failed runs are never lent (an error, not a result); pre-registered confirmations
neither lend nor borrow (their seeds are the confirmation's own).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from normbench.claims import rules
from normbench.core.provenance import provenance_of
from normbench.core.runs import CONFIG, METRICS, SUMMARY, RunDir

LENT = (CONFIG, SUMMARY, METRICS)  # what a run's result is read from; never its checkpoints or weights
SKIPPED = {"confirmations"}
LENDABLE = ("completed", "diverged")  # a failed run is trained again, never lent


def lend(claim_path: Path, args: list[str], folder: Path, sources: list[Path]) -> dict[str, int]:
    """Copy into ``folder`` (the runs of the claim at ``claim_path``, its rule recorded) each run its
    sweep ``args`` would train that another claim's folder under ``sources`` holds finished, of the same
    config, trained after this claim's rule was fixed; the number lent by each claim lending."""
    from normbench.sweeps.planning import plan_sweep

    rule_commit = (rules.read(folder) or {}).get("rule_commit")
    if not rule_commit:
        return {}
    wanted = {job.config_hash: job.run_dir for job in plan_sweep(args).jobs if job.state == "new"}
    lent: dict[str, int] = {}
    for config_hash, source, summary in _finished(sources, folder, set(wanted)):
        if config_hash not in wanted or not _trained_after(rule_commit, summary, claim_path.parent):
            continue
        target = wanted.pop(config_hash)
        target.mkdir(parents=True, exist_ok=True)
        for name in LENT:
            if (source / name).is_file():
                shutil.copyfile(source / name, target / name)
        lent[source.parent.name] = lent.get(source.parent.name, 0) + 1
    return lent


def _finished(sources: list[Path], folder: Path, hashes: set[str]):
    """(config hash, run directory, summary) of each completed or diverged run of these config hashes,
    of this code's numerics, in the claim folders under ``sources``."""
    for source in sources:
        claims = (
            sorted(p for p in source.iterdir() if p.is_dir() and p.name not in SKIPPED)
            if source.is_dir()
            else []
        )
        for claim in claims:
            if claim.resolve() == folder.resolve():
                continue
            for run in sorted(p for p in claim.iterdir() if (p / SUMMARY).is_file()):
                stored = RunDir(run)
                if (h := stored.config_hash()) not in hashes:
                    continue
                decision = stored.decide(h, sweep=True)  # a result of this config, of this code's numerics
                if decision.action == "reuse" and decision.result.get("status") in LENDABLE:
                    yield h, run, decision.result


def _trained_after(rule_commit: str, summary: dict, repository: Path) -> bool:
    """Whether the run of this ``summary`` trained at a clean commit that is ``rule_commit`` or descends
    from it, in the git repository holding the claim."""
    block = provenance_of(summary)
    commit = block.get("commit")
    if not commit or block.get("dirty") is not False:
        return False
    try:
        done = subprocess.run(
            ["git", "merge-base", "--is-ancestor", rule_commit, str(commit)],
            cwd=repository,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0

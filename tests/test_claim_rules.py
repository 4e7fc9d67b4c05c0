"""A claim's rule, fixed before its data: the commit that fixed it, the rule a pilot records when it
starts, and a verdict whose rule moved after that deciding nothing."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml
from omegaconf import OmegaConf
from planted import PROVENANCE, pair, write_claim

from normbench.claims import rules, sharing
from normbench.claims.checking import check_claim, shape_of
from normbench.claims.running import seconds_per_run, sweep_args
from normbench.claims.schema import parse_claim
from normbench.claims.verdicts import assess
from normbench.core.fileio import leaves
from normbench.core.provenance import NUMERICS
from normbench.sweeps.planning import job_configs, plan_sweep

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(folder, *args) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def commit(folder, message) -> str:
    git(folder, "add", "-A")
    git(folder, "commit", "-q", "-m", message)
    return git(folder, "rev-parse", "--short", "HEAD")


def edit(path, change) -> None:
    body = yaml.safe_load(path.read_text())
    change(body)
    path.write_text(yaml.safe_dump(body, sort_keys=False))


@needs_git
def test_a_rules_commit_is_the_oldest_commit_since_which_its_rule_has_not_changed(tmp_path):
    """Commit 1 writes the claim, commit 2 rewords its prose, commit 3 moves its margin: the rule is
    commit 1's until commit 3, and commit 3's after; an edit not yet committed has no rule commit."""
    git(tmp_path, "init", "-q")
    path = write_claim(
        tmp_path / "conf", "c", kind="not_worse", a={"norm": "rms"}, b={"norm": "ln"}, delta=0.02
    )
    first = commit(tmp_path, "claim")
    edit(path, lambda b: b.update(claim="Reworded.") or b["predicate"].update(why="a prior, said"))
    commit(tmp_path, "prose")
    assert rules.rule_commit(path) == first
    edit(path, lambda b: b["predicate"].update(delta=0.05))
    assert rules.rule_commit(path) is None  # the file as it is was never committed
    third = commit(tmp_path, "margin")
    assert rules.rule_commit(path) == third
    folder = tmp_path / "claims" / "c"
    folder.mkdir(parents=True)
    kept = rules.record(folder, path, "s1")
    assert kept == {
        "fingerprint": kept["fingerprint"],
        "sweep": "s1",
        "rule_commit": third,
        "pilot_commit": third,
    }
    assert yaml.safe_load((folder / rules.FILE).read_text()) == kept


def test_a_pilot_keeps_the_rule_it_started_under_and_sees_a_change_of_rule_or_sweep(tmp_path):
    """rule.yaml is written once, when the pilot starts. Rewording the claim changes nothing; a new
    margin, or a sweep composed differently (its experiment file or a default edited), is a new rule."""
    path = write_claim(
        tmp_path / "conf", "c", kind="not_worse", a={"norm": "rms"}, b={"norm": "ln"}, delta=0.02
    )
    folder = tmp_path / "claims" / "c"
    folder.mkdir(parents=True)
    started = rules.record(folder, path, "s1")
    assert (started["sweep"], started["rule_commit"]) == ("s1", None)  # outside git: no commit to name
    edit(path, lambda b: b.update(claim="Reworded.") or b["predicate"].update(why="said again"))
    assert rules.record(folder, path, "s2") == started  # kept, not rewritten
    assert not rules.changed(folder, path) and not rules.changed(folder, path, "s1")
    assert rules.changed(folder, path, "s2")
    edit(path, lambda b: b["predicate"].update(delta=0.05))
    assert rules.changed(folder, path) and rules.changed(folder, path, "s1")
    assert not rules.changed(tmp_path / "claims" / "never_piloted", path)


def test_a_verdict_whose_rule_changed_after_its_pilot_began_decides_nothing(tmp_path):
    """rms is 0.5 worse than ln on every seed: under the rule it was piloted with (rms better by 0.1) it
    is not reproduced; with the margin moved after the pilot began it is inconclusive, whatever its data."""
    path = write_claim(tmp_path / "conf", "c", kind="better", a={"norm": "rms"}, b={"norm": "ln"}, delta=0.1)
    folder = tmp_path / "claims" / "c"
    pair(folder, [3.5, 3.52, 3.49], [3.0, 3.01, 2.99])
    rules.record(folder, path)
    assert assess(parse_claim(path), folder).word == "not reproduced"
    edit(path, lambda b: b["predicate"].update(delta=0.3))
    moved = assess(parse_claim(path), folder)
    assert moved.word == "inconclusive"
    assert "its rule changed after its pilot began" in moved.outcome.reason


def test_the_sweeps_fingerprint_follows_what_its_jobs_compute_not_how_they_run(tmp_path):
    """The same claim composed twice gives one fingerprint; a default its jobs read, changed, gives
    another; how many jobs run at once does not."""
    path = write_claim(
        tmp_path / "conf", "c", kind="not_worse", a={"norm": "rms"}, b={"norm": "ln"}, delta=0.02
    )
    claim = parse_claim(path)
    base = check_claim(claim).sweep
    assert check_claim(claim).sweep == base
    assert check_claim(claim, ["hydra.launcher.n_jobs=2", "train.progress=false"]).sweep == base
    assert check_claim(claim, ["train.warmup_steps=7"]).sweep != base


def lender_run(folder, cfg, commit, status="completed"):
    """A finished run of ``cfg`` in another claim's folder, trained at ``commit``."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    block = {**PROVENANCE, "commit": commit, "numerics": NUMERICS}
    (folder / "summary.json").write_text(
        json.dumps({"status": status, "final_val_loss": 2.0, "provenance": block})
    )
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "val_loss": 2.0}) + "\n")


@needs_git
def test_a_run_another_claim_trained_after_this_claims_rule_is_shared_not_trained_again(tmp_path):
    """Claim c runs ln and rms over seeds 0-2. Another claim's folder holds, of the very same configs,
    ln seed 0 trained after c's rule was committed, ln seed 1 trained before it, and ln seed 2 that
    failed: only seed 0 is copied into c's folder, and c's sweep then plans 5 runs, not 6."""
    git(tmp_path, "init", "-q")
    (tmp_path / "README").write_text("before the rule\n")
    before = commit(tmp_path, "before")
    path = write_claim(
        tmp_path / "conf", "c", kind="not_worse", a={"norm": "rms"}, b={"norm": "ln"}, delta=0.02
    )
    commit(tmp_path, "rule")
    (tmp_path / "README").write_text("after the rule\n")
    after = commit(tmp_path, "after")
    claim = parse_claim(path)
    out = tmp_path / "claims"
    args = sweep_args(claim, [], out, tmp_path / "conf")
    configs = {(cfg.norm.name, cfg.seed): cfg for _, cfg in job_configs(args)}
    lender_run(out / "other" / "ln-s0", configs["ln", 0], after)
    lender_run(out / "other" / "ln-s1", configs["ln", 1], before)
    lender_run(out / "other" / "ln-s2", configs["ln", 2], after, status="failed")
    folder = out / "c"
    folder.mkdir(parents=True)
    rules.record(folder, path)
    assert sharing.lend(path, args, folder, [out]) == {"other": 1}
    plan = plan_sweep(args)
    held = [j for j in plan.jobs if j.state != "new"]
    assert [j.state for j in held] == ["completed"] and len(plan.jobs) == 6
    copied = held[0].run_dir
    stored = OmegaConf.load(copied / "config.yaml")
    assert (stored.norm.name, stored.seed) == ("ln", 0)
    assert (copied / "summary.json").read_text() == (out / "other" / "ln-s0" / "summary.json").read_text()
    assert sharing.lend(path, args, folder, [out]) == {}  # nothing left to lend


def test_a_claim_not_yet_run_is_timed_by_finished_runs_of_its_shape_in_other_claims_folders(tmp_path):
    """Claim c's jobs compose one shape (its model's depth, width, context, steps and batch). Another
    claim's folder holds completed runs of that shape taking 10 s and 20 s, a failed one of 900 s, and a
    deeper run of 500 s: c's runs are timed at 15 s each, the source said. With no run of its shape
    the time is not known, never guessed from another shape."""
    path = write_claim(
        tmp_path / "conf", "c", kind="not_worse", a={"norm": "rms"}, b={"norm": "ln"}, delta=0.02
    )
    claim = parse_claim(path)
    out = tmp_path / "claims"
    checked = check_claim(claim, [], tmp_path / "conf")
    cfg = job_configs(sweep_args(claim, [], out, tmp_path / "conf"))[0][1]
    deeper = cfg.copy()
    deeper.model.n_layer = cfg.model.n_layer * 2
    for name, config, wall, status in [
        ("a", cfg, 10.0, "completed"),
        ("b", cfg, 20.0, "completed"),
        ("c", cfg, 900.0, "failed"),
        ("d", deeper, 500.0, "completed"),
    ]:
        lender_run(out / "other" / name, config, "abc1234", status=status)
        summary = json.loads((out / "other" / name / "summary.json").read_text())
        (out / "other" / name / "summary.json").write_text(json.dumps({**summary, "wall_s": wall}))
    assert len(set(checked.shapes)) == 1 and checked.jobs == len(checked.shapes)

    per_run, source = seconds_per_run(claim, out / "c", shapes=checked.shapes, records=[out])
    assert per_run == pytest.approx(15.0)
    assert source == f"2 finished runs of the same size and steps in {out}"

    (deeper_only,) = {shape_of(leaves(OmegaConf.to_container(deeper)))}
    assert seconds_per_run(claim, out / "c", shapes=(deeper_only,), records=[out])[0] == pytest.approx(500.0)
    moved = tuple((*s[:3], s[3] * 2, s[4]) for s in checked.shapes)  # twice the steps: no run of it
    assert seconds_per_run(claim, out / "c", shapes=moved, records=[out])[0] is None

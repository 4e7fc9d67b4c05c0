"""One owner per run directory: RunDir.decide's rules, the run lock, two sweeps on one directory, a full
disk."""

from __future__ import annotations

import csv
import errno
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import compose_cfg, read_metrics, tiny, train_tiny

from normbench.core import provenance
from normbench.core.runs import RunDir, RunLock, write_index
from normbench.sweeps.job import run_job
from normbench.training import sinks

HASH, OTHER = "a" * 16, "b" * 16


def _dir(tmp_path, summary=None, config_hash=None, checkpoint_hash=None) -> RunDir:
    """A run directory holding a summary, a config.yaml of some hash and a checkpoint of some hash."""
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    if summary is not None:
        run.write_summary(summary)
    run.config_hash = lambda: config_hash  # the hash of config.yaml, read from a real file elsewhere
    if checkpoint_hash is not None:
        torch.save({"step": 5, "config_hash": checkpoint_hash}, run.path / "checkpoint.pt")
    return run


@pytest.mark.parametrize(
    "held, sweep, retry, resume, action",
    [
        # (summary status, config.yaml hash, checkpoint hash)
        (("completed", HASH, None), True, False, "auto", "reuse"),
        (("diverged", HASH, None), True, False, "auto", "reuse"),
        (("diverged", HASH, None), True, True, "auto", "fresh"),  # --retry-failed
        (("completed", HASH, None), False, False, "auto", "reuse"),  # normbench train keeps its result
        (("diverged", HASH, None), False, False, "auto", "reuse"),
        (("failed", HASH, None), False, False, "auto", "fresh"),  # a crash is tried again
        (("completed", HASH, None), False, False, "never", "fresh"),  # train.resume=never trains it again
        (("completed", OTHER, None), False, False, "auto", "refuse"),  # another config's result is kept
        (("completed", OTHER, None), False, False, "never", "refuse"),  # whatever train.resume says
        (("failed", OTHER, None), False, False, "auto", "refuse"),
        (("completed", None, None), False, False, "auto", "refuse"),  # a result whose config is unknown
        (("completed", None, None), False, False, "never", "refuse"),
        ((None, OTHER, None), False, False, "auto", "refuse"),  # another config, killed before a checkpoint
        ((None, OTHER, None), False, False, "never", "fresh"),
        (("completed", OTHER, None), True, False, "auto", "fresh"),  # a result of another config
        ((None, HASH, HASH), True, False, "auto", "resume"),
        ((None, HASH, None), True, False, "auto", "resume"),  # killed before its first checkpoint
        ((None, HASH, HASH), False, False, "never", "fresh"),
        ((None, None, HASH), False, False, "auto", "resume"),  # train() from Python: no config.yaml
        ((None, OTHER, OTHER), False, False, "auto", "refuse"),
        ((None, OTHER, OTHER), False, False, "never", "fresh"),
        ((None, OTHER, OTHER), True, False, "auto", "fresh"),  # a sweep's directory is its config's
        ((None, None, None), False, False, "auto", "fresh"),
    ],
)
def test_decide_answers_reuse_resume_fresh_or_refuse(tmp_path, held, sweep, retry, resume, action):
    status, config_hash, checkpoint_hash = held
    current = {"numerics": provenance.NUMERICS}
    run = _dir(
        tmp_path, {"status": status, "provenance": current} if status else None, config_hash, checkpoint_hash
    )
    decision = run.decide(HASH, sweep=sweep, retry=retry, resume=resume)
    assert decision.action == action
    if action == "refuse":
        whose = "another config" if config_hash else "whose config.yaml is missing or unreadable"
        assert whose in decision.reason and "hydra.run.dir=" in decision.reason
        # train.resume=never starts an unfinished run over; it never replaces a result
        assert ("train.resume=never" in decision.reason) == (status is None)


@pytest.mark.parametrize("sweep", [True, False])
def test_a_result_of_other_numerics_is_trained_again_not_reused(tmp_path, monkeypatch, sweep):
    """A stored result is reused only when the code computes what it computed: its numerics agree."""
    monkeypatch.setattr(provenance, "NUMERICS", 2)
    for numerics, action in ((2, "reuse"), (1, "fresh"), (3, "fresh")):
        path = tmp_path / str(numerics)
        path.mkdir()
        held = _dir(path, {"status": "completed", "provenance": {"numerics": numerics}}, HASH)
        decision = held.decide(HASH, sweep=sweep)
        assert decision.action == action
        assert decision.stale == (None if numerics == 2 else numerics)
    # a summary stored before results carried provenance counts as the oldest numerics
    (tmp_path / "legacy").mkdir()
    legacy = _dir(tmp_path / "legacy", {"status": "completed"}, HASH).decide(HASH, sweep=sweep)
    assert (legacy.action, legacy.stale) == ("fresh", provenance.LEGACY_NUMERICS)


def test_train_into_a_result_older_code_computed_trains_it_again_and_says_so(tmp_path, monkeypatch, capsys):
    cfg = compose_cfg(tiny("train.steps=2"))
    run_dir = RunDir(tmp_path / "run")
    run_dir.write_config(cfg)
    run_dir.write_summary({"status": "completed", "final_val_loss": 9.0, "provenance": {"numerics": 1}})
    monkeypatch.setattr(provenance, "NUMERICS", 2)
    run_job(cfg, str(run_dir.path), multirun=False)
    assert (
        f"{run_dir.path}: its result was computed by other code (numerics 1, now 2): training it again"
        in (" ".join(capsys.readouterr().err.split()))
    )
    summary = run_dir.read_summary()
    assert summary["status"] == "completed" and summary["provenance"]["numerics"] == 2
    assert summary["final_val_loss"] != 9.0


def test_prepare_keeps_what_a_resume_needs_and_clears_the_rest(tmp_path):
    """A fresh start keeps nothing an earlier run wrote that would be read as this run's: its weights and
    TensorBoard events included."""
    events = "events.out.tfevents.1700000000.host.1.0"
    resumed = {"metrics.jsonl", "checkpoint.pt", "checkpoint.prev.pt", "model.pt", events}
    for action, kept in (("resume", resumed), ("fresh", set())):
        path = tmp_path / action
        path.mkdir()
        for name in ("summary.json", "metrics.jsonl", "error.log", "checkpoint.pt", "checkpoint.prev.pt"):
            (path / name).write_text("x")
        (path / "model.pt").write_text("x")
        (path / events).write_text("x")
        run = RunDir(path)
        run.prepare(type("D", (), {"action": action})())
        assert {p.name for p in path.iterdir()} == kept


# ----------------------------------------------------------------------------- the lock


HOLD = (
    "import sys, time; from normbench.core.runs import RunLock; lock = RunLock(sys.argv[1]); "
    "lock.acquire(); lock.claim(); print('held', flush=True); time.sleep(60)"
)


def _holder(run_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_lock_names_its_holder_and_a_kill_never_leaves_it_stale(tmp_path):
    proc = _holder(tmp_path)
    try:
        assert RunLock(tmp_path).holder() == f"pid {proc.pid} on {os.uname().nodename}"
        assert RunLock(tmp_path).acquire() is not None
    finally:
        proc.kill()
        proc.wait()
    assert RunLock(tmp_path).holder() is None  # the kernel dropped it with the process
    lock = RunLock(tmp_path)
    assert lock.acquire() is None
    lock.claim()
    assert lock.last_owner()["pid"] == os.getpid()
    lock.release()


def test_a_run_whose_directory_is_owned_elsewhere_is_refused_and_left_alone(tmp_path, capsys):
    run_dir = tmp_path / "run"
    proc = _holder(run_dir)
    try:
        with pytest.raises(SystemExit) as exit_:
            run_job(compose_cfg(tiny()), str(run_dir), multirun=False)
        assert exit_.value.code == 2
        assert f"running elsewhere: pid {proc.pid}" in capsys.readouterr().err
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nothing written
        # A finished sweep's index counts it as running elsewhere, not as interrupted.
        (run_dir / "config.yaml").write_text("seed: 0\n")
        (tmp_path / "plan.json").write_text(
            json.dumps({"jobs": [{"job": 0, "overrides": [], "run_dir": "run"}]})
        )
        assert write_index(tmp_path, final=True)[0]["status"] == "running elsewhere"
    finally:
        proc.kill()
        proc.wait()
    assert write_index(tmp_path, final=True)[0]["status"] == "interrupted"


def plant_grid_run(sweep_dir: Path, name: str, overrides: list[str], summary: dict | None) -> None:
    """A run directory as a sweep's job leaves it: its overrides, config and, when it finished, summary."""
    (sweep_dir / name / ".hydra").mkdir(parents=True)
    (sweep_dir / name / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (sweep_dir / name / "config.yaml").write_text("seed: 0\n")
    if summary is not None:
        (sweep_dir / name / "summary.json").write_text(json.dumps(summary))


def test_the_index_lists_every_run_of_a_directory_that_holds_several_grids(tmp_path):
    # an earlier grid (norm=ln,rms) and the latest one (norm=gn), whose plan.json names only its own job
    plant_grid_run(tmp_path, "ln-pre-s0-aaaa", ["norm=ln"], {"status": "completed", "final_val_loss": 2.5})
    plant_grid_run(tmp_path, "rms-pre-s0-bbbb", ["norm=rms"], {"status": "diverged", "final_val_loss": None})
    plant_grid_run(tmp_path, "gn-pre-s0-cccc", ["norm=gn"], {"status": "completed", "final_val_loss": 2.7})
    (tmp_path / "report").mkdir()  # a report written into the sweep directory is no run
    (tmp_path / "plan.json").write_text(
        json.dumps({"jobs": [{"job": 0, "overrides": ["norm=gn"], "run_dir": "gn-pre-s0-cccc"}]})
    )
    write_index(tmp_path, final=True)
    with open(tmp_path / "index.csv", newline="") as f:
        rows = {r["run_dir"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["gn-pre-s0-cccc", "ln-pre-s0-aaaa", "rms-pre-s0-bbbb"]
    assert rows["gn-pre-s0-cccc"]["job"] == "0"  # the latest grid's job keeps its number
    assert rows["ln-pre-s0-aaaa"]["job"] == "" and rows["ln-pre-s0-aaaa"]["overrides"] == "norm=ln"
    assert [rows[d]["status"] for d in sorted(rows)] == ["completed", "completed", "diverged"]
    assert rows["ln-pre-s0-aaaa"]["final_val_loss"] == "2.5"


@pytest.mark.slow
def test_the_same_sweep_started_twice_at_once_trains_every_run_exactly_once(tmp_path):
    sweep_dir = tmp_path / "S"
    args = [
        "sweep",
        "norm=ln,rms",
        "placement=pre,post",
        "seed=0,1",
        "model=micro",
        "train.steps=60",
        "train.eval_every=20",
        "train.progress=false",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    procs = []
    for _ in range(2):
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "normbench", *args],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
        time.sleep(1)
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    run_dirs = [d for d in sweep_dir.iterdir() if (d / "config.yaml").exists()]
    assert len(run_dirs) == 8
    owners = {}
    for run_dir in run_dirs:
        records = read_metrics(run_dir)  # every line parses: no torn fragment of another writer
        assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 20, 40, 60], run_dir
        assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
        owners[run_dir.name] = RunLock(run_dir).last_owner()["sweep"]
    trained_by = {
        pid: sum(o.split("@")[0] == str(p.pid) for o in owners.values())
        for pid, p in zip(("first", "second"), procs)
    }
    assert sum(trained_by.values()) == 8  # each run trained once, by one of the two
    for out, other in ((outs[0], trained_by["second"]), (outs[1], trained_by["first"])):
        # What a sweep saw at its end: the other one may still be training its last run.
        counts = re.search(r"8 runs: (\d+) completed(?:, (\d+) running elsewhere)?[,;]", out)
        assert counts and int(counts[1]) + int(counts[2] or 0) == 8, out
        if other:  # each sweep says what the other one trained (or trains still, when it ended first)
            said = re.search(r"(\d+) runs? trained by another process \(pid \d+ on ", out)
            assert said and 1 <= int(said[1]) <= other, out


# ----------------------------------------------------------------------------- a full disk


def test_a_full_disk_is_one_line_and_the_same_command_resumes(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    overrides = tiny("train.checkpoint_every=5", "train.log_every=5", "train.eval_every=10")
    to_json = sinks.to_json

    def to_json_until_full(record):
        # Inside JsonlSink.log's write: half a line reaches the disk, then the disk is full.
        if record.get("kind") == "train" and record.get("step") == 15:
            with open(run_dir / "metrics.jsonl", "a") as f:
                f.write('{"kind": "train", "st')
            raise OSError(errno.ENOSPC, "No space left on device")
        return to_json(record)

    with monkeypatch.context() as m, pytest.raises(SystemExit) as exit_:
        m.setattr(sinks, "to_json", to_json_until_full)
        run_job(compose_cfg(overrides), str(run_dir), multirun=False)
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (
        f"error: no space left on device writing {run_dir / 'metrics.jsonl'}; free space and run the same "
        "command again to resume from step 10"
    ) in " ".join(err.split())
    assert not (run_dir / "summary.json").exists() and not (run_dir / "error.log").exists()

    run_job(compose_cfg(overrides), str(run_dir), multirun=False)  # space freed: the same command
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_at"] == [10]
    steps = [(r["kind"], r["step"]) for r in read_metrics(run_dir) if r["kind"] != "stats"]
    assert len(steps) == len(set(steps)) and ("train", 20) in steps  # the torn line cut, every record once
    reference = tmp_path / "reference"
    train_tiny(reference, "train.checkpoint_every=5", "train.log_every=5", "train.eval_every=10")
    assert [r.get("val_loss") for r in read_metrics(run_dir) if r["kind"] == "eval"] == [
        r.get("val_loss") for r in read_metrics(reference) if r["kind"] == "eval"
    ]


def test_train_from_python_keeps_its_config_and_a_later_cli_run_cannot_wipe_it(tmp_path):
    """train() writes config.yaml as the CLI does; a result without one (written by hand, or by an
    older normbench) is refused by a single run of any config: one line, every file kept."""
    from conftest import train_tiny

    summary = train_tiny(tmp_path / "py", "train.steps=2")
    stored = RunDir(tmp_path / "py").config_hash()
    assert stored is not None and stored == summary["config_hash"]
    (tmp_path / "py" / "config.yaml").unlink()
    before = {p.name: p.read_bytes() for p in (tmp_path / "py").iterdir() if p.is_file()}
    decision = RunDir(tmp_path / "py").decide("0" * 16)
    assert decision.action == "refuse" and "config.yaml is missing or unreadable" in decision.reason
    assert {p.name: p.read_bytes() for p in (tmp_path / "py").iterdir() if p.is_file()} == before

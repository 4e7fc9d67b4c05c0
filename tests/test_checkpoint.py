"""Checkpoints and exact resume: a run stopped anywhere and resumed ends as if never stopped."""

from __future__ import annotations

import io
import json
import os
import pickle
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import compose_cfg, read_metrics, run_cli, tiny, train_tiny
from rich.console import Console

from normbench.core.errors import ConfigError
from normbench.core.runs import read_index
from normbench.model.gpt import GPT
from normbench.sweeps.sweep import run_sweep
from normbench.training import checkpoint, preemption
from normbench.training.config import parse_config
from normbench.training.preemption import StopSignals
from normbench.training.sinks import MetricSinks

TIMING = ("tokens_per_s", "step_ms")  # wall-clock figures: the only fields two identical runs may differ in
LOSSES = ("status", "final_val_loss", "best_val_loss", "max_grad_norm", "clip_fraction", "steps", "params")
# Checkpoints every 10 steps (as evals), statistics every 4, train records every 5: the cadences cross.
# One thread: the test machine is shared, and more threads than free cores is slower, not faster.
RUN = ("train.stats_every=4", "train.threads=1", "train.checkpoint_every=10")
VARIANTS = {"ln-dropout": ("model.dropout=0.1",), "bn-dropout": ("norm=bn", "model.dropout=0.1")}
# A record logged during each step the tests stop at (train records every 5 steps, statistics
# at steps 1, 5, 9, 13, ... labelled with the step before).
RECORD_IN_STEP = {5: ("train", 5), 10: ("train", 10), 13: ("stats", 12), 15: ("train", 15)}


def curve(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(run_dir)]


def summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """Bit for bit the reference's losses, every record once, and no checkpoint (nor a write's temporary
    file) left behind."""
    got, want = curve(run_dir), curve(reference)
    assert got == want
    keys = [(r["kind"], r["step"]) for r in got]
    assert len(keys) == len(set(keys)), "a record appears twice"
    assert {k: summary(run_dir)[k] for k in LOSSES} == {k: summary(reference)[k] for k in LOSSES}
    assert not (run_dir / "checkpoint.pt").exists() and not (run_dir / "checkpoint.prev.pt").exists()
    assert not list(run_dir.glob(".checkpoint*")), "a temporary checkpoint file was left behind"


def signal_at(monkeypatch, step: int, sig=signal.SIGTERM) -> None:
    """Send ``sig`` to this very process during step ``step``: a real signal at a known step (the
    loop notes it and stops at the end of that step)."""
    log, when = MetricSinks.log, RECORD_IN_STEP[step]

    def log_and_signal(self, record):
        log(self, record)
        if (record.get("kind"), record.get("step")) == when:
            os.kill(os.getpid(), sig)

    monkeypatch.setattr(MetricSinks, "log", log_and_signal)


def crash_at(monkeypatch, step: int) -> None:
    """Stop the process dead in step ``step`` (KeyboardInterrupt passes through train untouched): what
    is on disk afterwards is what a kill -9 there leaves, the torn line apart."""
    log = MetricSinks.log

    def log_and_die(self, record):
        log(self, record)
        if record.get("kind") == "train" and record.get("step") == step:
            raise KeyboardInterrupt

    monkeypatch.setattr(MetricSinks, "log", log_and_die)


@pytest.fixture
def ctrl_c_reaches_us():
    """SIGINT at Python's default, as in a terminal's foreground process: a test run started in the
    background (cmd &, CI) inherits it ignored, and a run that ignores Ctrl-C rightly goes on."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """An uninterrupted run without checkpoints per variant, made when first asked for."""
    made = {}

    def get(variant: str) -> tuple[tuple, Path]:
        if variant not in made:
            overrides = (*RUN, *VARIANTS[variant])
            run_dir = tmp_path_factory.mktemp(variant)
            train_tiny(run_dir, *overrides, "train.checkpoint_every=0")
            made[variant] = overrides, run_dir
        return made[variant]

    return get


def test_checkpoints_do_not_change_the_run(references, tmp_path):
    overrides, ref = references("ln-dropout")
    train_tiny(tmp_path, *overrides)  # checkpoints every 10 steps, removed at the end
    assert_same_run(tmp_path, ref)


# Right at a checkpoint, and between two (BatchNorm's running statistics and dropout's RNG restored);
# a first Ctrl-C (SIGINT) is the same stop as SLURM's SIGTERM.
@pytest.mark.parametrize(
    "variant, stop_at, sig",
    [
        ("ln-dropout", 10, signal.SIGTERM),
        ("bn-dropout", 13, signal.SIGTERM),
        ("bn-dropout", 15, signal.SIGINT),
    ],
    ids=["sigterm-at-checkpoint", "sigterm-between", "ctrl-c-between"],
)
def test_sigterm_and_ctrl_c_checkpoint_at_the_end_of_the_step_and_resume_is_exact(
    references, tmp_path, monkeypatch, ctrl_c_reaches_us, variant, stop_at, sig
):
    overrides, ref = references(variant)
    with monkeypatch.context() as m:
        signal_at(m, stop_at, sig)
        out = train_tiny(tmp_path, *overrides)
    assert out["status"] == "interrupted" and out["steps"] == stop_at and out["signal"] == sig
    assert not (tmp_path / "summary.json").exists()  # not a result: the sweep sees an interrupted run
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)  # plain tensors, numbers, strings
    assert saved["step"] == stop_at
    assert stop_at - 1 <= max(r["step"] for r in read_metrics(tmp_path)) <= stop_at  # nothing logged after it
    if "norm=bn" in overrides:
        assert any(k.endswith("running_var") for k in saved["model"])
    out = train_tiny(tmp_path, *overrides)
    assert out["resumed_at"] == [stop_at]
    assert_same_run(tmp_path, ref)


def test_a_second_ctrl_c_stops_at_once_and_the_handlers_are_given_back(ctrl_c_reaches_us):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGINT)  # the first: noted, training goes on to the end of the step
        assert stop.received == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_one_handler_notes_every_stop_signal_before_and_during_the_loop(ctrl_c_reaches_us):
    """A sweep's worker and a job before its loop note Ctrl-C with the handler the loop's stop signals
    have: one flag, read by the loop at step boundaries, and answered once the loop has stopped."""
    with preemption.noting_ctrl_c():
        before_the_loop = signal.getsignal(signal.SIGINT)
        with StopSignals() as stop:
            handlers = {signal.getsignal(sig) for sig in (*preemption.SIGNALS, signal.SIGINT)}
            assert handlers == {before_the_loop}
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.received == preemption.noted() == signal.SIGTERM
        assert stop.received == signal.SIGTERM and preemption.noted() is None


def test_a_ctrl_c_before_the_loop_watches_stops_the_run_at_its_first_step(tmp_path, ctrl_c_reaches_us):
    """A job notes Ctrl-C from its start (a sweep's workers from theirs): one that comes while the run is
    set up is not raised into whatever import or build is under way, where it can be lost."""
    with preemption.noting_ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)  # as if during the set-up: noted, nothing raised
        assert preemption.noted() == signal.SIGINT
        out = train_tiny(tmp_path, *RUN)
        assert out["status"] == "interrupted" and out["steps"] == 0 and out["signal"] == signal.SIGINT
        assert preemption.noted() is None  # the run stopped for it: the next one trains
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):  # a second before the loop stops at once
            os.kill(os.getpid(), signal.SIGINT)
        assert preemption.noted() is None
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert train_tiny(tmp_path, *RUN)["resumed_at"] == [0]


def test_ctrl_c_stays_ignored_where_the_process_started_ignoring_it():
    """A shell's background job (cmd &) starts with SIGINT ignored: the terminal's Ctrl-C is not for it."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            assert stop.received is None
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_kill_resumes_from_the_last_checkpoint_and_cuts_the_log_back(references, tmp_path, monkeypatch):
    overrides, ref = references("bn-dropout")
    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        crash_at(m, 15)  # checkpointed at 10; the records of steps 11-15 are on disk
        train_tiny(tmp_path, *overrides)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"kind": "tra')  # and the kill tore a line
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 10
    out = train_tiny(tmp_path, *overrides)
    assert out["resumed_at"] == [10]
    assert_same_run(tmp_path, ref)


class Unpicklable:
    """A part of a state that torch.save cannot write."""

    def __reduce__(self):
        raise pickle.PicklingError("cannot pickle this state")


def test_a_kill_mid_checkpoint_leaves_no_temporary_file_once_the_run_resumes(
    references, tmp_path, monkeypatch
):
    overrides, ref = references("ln-dropout")
    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        crash_at(m, 15)
        train_tiny(tmp_path, *overrides)
    stale = tmp_path / ".checkpoint.pt.k1ll3d.tmp"  # as atomic_file names it: a kill -9 during a write
    stale.write_bytes(b"PK\x03\x04 half of a checkpoint")
    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        crash_at(m, 15)  # resumed, then stopped dead again before the run ends
        train_tiny(tmp_path, *overrides)
    assert not stale.exists() and torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 10
    assert train_tiny(tmp_path, *overrides)["resumed_at"] == [10]  # the crashed resume saved nothing
    assert_same_run(tmp_path, ref)


def test_a_stop_whose_checkpoint_fails_names_the_step_saved_and_resumes_there(
    references, tmp_path, monkeypatch, capsys
):
    from normbench.sweeps.job import run_job

    overrides, ref = references("bn-dropout")
    save = checkpoint.save
    with monkeypatch.context() as m, pytest.raises(SystemExit) as exit_:
        signal_at(m, 13)  # SIGTERM in step 13: its checkpoint is the last the run writes, and it fails
        m.setattr(
            checkpoint, "save", lambda d, s: save(d, {**s, "bad": Unpicklable()} if s["step"] == 13 else s)
        )
        run_job(compose_cfg(tiny(*overrides)), str(tmp_path), multirun=False)
    assert exit_.value.code == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    failure = "checkpoint at step 13 not written (PicklingError: cannot pickle this state)"
    assert f"{failure}; the last saved is step 10" in err
    (line,) = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert line.startswith(
        "interrupted at step 13 (SIGTERM), its checkpoint not written (PicklingError: cannot pickle this "
        "state); resume at step 10 with: "
    )
    assert "checkpoint saved" not in err and "Traceback" not in err
    assert [p.name for p in tmp_path.glob("*checkpoint*")] == ["checkpoint.pt"]
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 10
    assert train_tiny(tmp_path, *overrides)["resumed_at"] == [10]
    assert_same_run(tmp_path, ref)


def test_a_stop_says_where_its_resume_starts_whether_or_not_its_checkpoint_was_written():
    from normbench.sweeps.job import stopped_checkpoint

    failure = "PicklingError: cannot pickle this state"
    assert stopped_checkpoint({"steps": 13, "saved_step": 13}) == "checkpoint saved; resume with"
    assert stopped_checkpoint({"steps": 13, "saved_step": 10, "checkpoint_failure": failure}) == (
        f"its checkpoint not written ({failure}); resume at step 10 with"
    )
    assert stopped_checkpoint({"steps": 3, "saved_step": None, "checkpoint_failure": failure}) == (
        f"its checkpoint not written ({failure}), none saved before; start again with"
    )


def test_the_loop_writes_its_checkpoints_on_its_own_thread(tmp_path, monkeypatch):
    """The loop never waits on a writer the scheduler may starve: there is none to wait on."""
    writers, save = [], checkpoint.save

    def recorded(run_dir, state):
        writers.append(
            (threading.current_thread(), os.sched_getscheduler(0) if hasattr(os, "SCHED_IDLE") else 0)
        )
        return save(run_dir, state)

    monkeypatch.setattr(checkpoint, "save", recorded)
    train_tiny(tmp_path, *RUN)
    own = (threading.current_thread(), os.sched_getscheduler(0) if hasattr(os, "SCHED_IDLE") else 0)
    assert len(writers) == 1 and set(writers) == {own}  # checkpoint_every=10 of 20 steps: step 10's


def test_damaged_checkpoints_fall_back_to_the_previous_one_then_to_a_fresh_start(
    references, tmp_path, monkeypatch, capsys
):
    overrides, ref = references("ln-dropout")
    with monkeypatch.context() as m:
        signal_at(m, 13)
        train_tiny(tmp_path, *overrides)
    newest, previous = tmp_path / "checkpoint.pt", tmp_path / "checkpoint.prev.pt"
    assert torch.load(previous, weights_only=True)["step"] == 10

    # Truncated: unreadable. The previous checkpoint (step 10) is used, with a warning.
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    assert checkpoint.load(tmp_path, warn=print)["step"] == 10
    assert "unreadable" in capsys.readouterr().out

    # One flipped byte inside a tensor's data still loads; the checksum catches it.
    data = bytearray(previous.read_bytes())
    weights = torch.load(previous, weights_only=True)["model"]["tok_emb.weight"]
    at = bytes(data).find(weights.numpy().tobytes()[:64])
    assert at > 0
    data[at + 3] ^= 0x10
    previous.write_bytes(bytes(data))
    assert not torch.equal(torch.load(previous, weights_only=True)["model"]["tok_emb.weight"], weights)
    warnings = []
    assert checkpoint.load(tmp_path, warn=warnings.append) is None
    assert "checksum" in warnings[-1]

    # Both damaged: the run starts afresh, says so, and still ends exactly as the reference.
    out = train_tiny(tmp_path, *overrides)
    assert out["resumed_at"] == []
    assert "not resuming from it" in capsys.readouterr().err
    assert_same_run(tmp_path, ref)


def test_a_checkpoint_of_another_config_is_refused_and_resume_never_starts_afresh(tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        signal_at(m, 5)
        train_tiny(tmp_path, *RUN, "train.lr=1e-3")
    with pytest.raises(ConfigError, match="another config.*train.resume=never"):
        train_tiny(tmp_path, *RUN, "train.lr=2e-3")
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 5  # left as it was
    out = train_tiny(tmp_path, *RUN, "train.lr=2e-3", "train.resume=never")
    assert out["status"] == "completed" and out["resumed_at"] == []
    steps = [r["step"] for r in read_metrics(tmp_path) if r["kind"] == "eval"]
    assert steps == [0, 10, 20]


def test_save_model_keeps_the_final_weights(tmp_path):
    train_tiny(tmp_path, *RUN, "train.save_model=true")
    run = parse_config(compose_cfg(tiny()))
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    model = GPT(run.model, 64, run.norm, run.placement)
    model.load_state_dict(state)  # every weight and buffer, nothing else
    assert not (tmp_path / "checkpoint.pt").exists()


def test_submitit_requeue_hook_runs_after_the_checkpoint(tmp_path, monkeypatch):
    """The handler that was there before ours (submitit's checkpoint-and-requeue on SIGUSR2) is called
    once the checkpoint is on disk, and what it does (requeue, exit) is left to it."""
    calls = []

    def submitit_handler(signum, frame):
        calls.append((signum, torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"]))
        raise SystemExit(144)  # submitit's local requeue exit code

    previous = signal.signal(signal.SIGUSR2, submitit_handler)
    try:
        with monkeypatch.context() as m, pytest.raises(SystemExit):
            signal_at(m, 5, sig=signal.SIGUSR2)
            train_tiny(tmp_path, *RUN)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert calls == [(signal.SIGUSR2, 5)]
    assert signal.getsignal(signal.SIGUSR2) is previous


# ----------------------------------------------------------------------------- real processes, real signals

CLI_RUN = tiny(
    "model=micro",
    "train.steps=40",
    "train.log_every=1",
    "train.eval_every=10",
    "train.threads=1",
    "train.stats_every=0",
    "model.dropout=0.1",
    "train.checkpoint_every=10",
)


def _wait_for(predicate, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        assert proc.poll() is None, "the run ended before it could be stopped"
        time.sleep(0.01)
    pytest.fail("timed out")


def _saved_step(run_dir: Path) -> int | None:
    """The step of the newest complete checkpoint (written beside training, it may land steps after)."""
    saved = checkpoint.load(run_dir, warn=lambda message: None)
    return None if saved is None else saved["step"]


def _last_step(run_dir: Path) -> int:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return max((json.loads(line)["step"] for line in lines if line.endswith("}")), default=-1)
    except (OSError, ValueError):
        return -1


# A run in its own process that kills itself (SIGKILL) 64 KiB into writing its first checkpoint.
KILLED_MID_CHECKPOINT = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from conftest import train_tiny
from normbench.training import checkpoint
write = checkpoint._Stream._write
def write_then_die(self, data):
    write(self, data)
    if self.f.tell() > 65536:
        self.f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
checkpoint._Stream._write = write_then_die
train_tiny(Path(sys.argv[2]), *sys.argv[3:])
"""


@pytest.mark.slow  # kill -9 of a process mid-checkpoint
def test_kill_9_mid_checkpoint_leaves_a_temporary_file_that_the_next_start_removes(
    references, tmp_path, monkeypatch
):
    overrides, ref = references("ln-dropout")
    tests = str(Path(__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_MID_CHECKPOINT, tests, str(tmp_path), *overrides],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (stale,) = tmp_path.glob(".checkpoint.pt.*.tmp")  # half a checkpoint, and no checkpoint.pt
    assert stale.stat().st_size > 65536 and not (tmp_path / "checkpoint.pt").exists()
    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        crash_at(m, 15)  # started again (afresh: nothing to resume from), stopped dead after its checkpoint
        train_tiny(tmp_path, *overrides)
    assert not stale.exists() and [p.name for p in tmp_path.glob("*checkpoint*")] == ["checkpoint.pt"]
    assert train_tiny(tmp_path, *overrides)["resumed_at"] == [10]
    assert_same_run(tmp_path, ref)


@pytest.mark.slow  # kill -9 and SIGTERM of CLI processes
def test_kill_9_and_sigterm_of_the_cli_then_the_same_command_resumes_exactly(tmp_path):
    ref = tmp_path / "ref"
    train_tiny(ref, *CLI_RUN, "train.checkpoint_every=0")  # in this process: the same computation
    args = ["train", *CLI_RUN]
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "normbench", *args, f"hydra.run.dir={run_dir}"]
    rng = __import__("random").Random(0)

    # kill -9 right after the first checkpoint, then mid-way between two, at a random step each time.
    stops = [
        lambda: (run_dir / "checkpoint.pt").exists(),
        lambda: _last_step(run_dir) >= 20 + rng.randrange(1, 9) and _saved_step(run_dir) == 20,
    ]
    for ready in stops:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for(ready, proc)
        proc.kill()
        proc.wait()
    assert not (run_dir / "summary.json").exists()

    # SIGTERM: a checkpoint at the end of the step, exit code 128 + 15, the log ends at that step.
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for(lambda: _last_step(run_dir) >= 31 + rng.randrange(0, 5), proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "interrupted" in out and "Traceback" not in out
    stopped = torch.load(run_dir / "checkpoint.pt", weights_only=True)["step"]
    assert _last_step(run_dir) == stopped

    result = run_cli(*args, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr
    assert f"resuming at step {stopped}" in result.stderr
    resumed_at = summary(run_dir)["resumed_at"]
    assert len(resumed_at) == 3 and resumed_at[-1] == stopped
    assert_same_run(run_dir, ref)


@pytest.mark.slow  # Ctrl-C to a CLI process
def test_ctrl_c_checkpoints_at_the_step_reached_and_the_command_it_prints_resumes_exactly(tmp_path):
    ref = tmp_path / "ref"
    train_tiny(ref, *CLI_RUN, "train.checkpoint_every=0")  # in this process: the same computation
    # The default run directory, named after the time: the printed command must name it to resume.
    proc = subprocess.Popen(
        [sys.executable, "-m", "normbench", "train", *CLI_RUN],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A terminal's Ctrl-C reaches a process whose SIGINT is at its default, whatever the test
        # runner's is (a shell's background job inherits it ignored).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    runs = tmp_path / "results" / "runs"
    _wait_for(lambda: runs.exists() and any(_last_step(d) >= 13 for d in runs.iterdir()), proc)
    proc.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal sends
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    (run_dir,) = runs.iterdir()
    stopped = torch.load(run_dir / "checkpoint.pt", weights_only=True)["step"]
    assert stopped >= 13 and _last_step(run_dir) == stopped  # the step reached, not the checkpoint at 10
    assert not (run_dir / "summary.json").exists()  # interrupted: not a result
    (line,) = [line for line in out.splitlines() if line.startswith("interrupted")]
    assert line.startswith(f"interrupted at step {stopped} (Ctrl-C), checkpoint saved; resume with: ")
    command = shlex.split(line.split("resume with: ")[1])
    assert command[:2] == ["normbench", "train"]

    result = run_cli(*command[1:], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"resuming at step {stopped}" in result.stderr
    assert summary(run_dir)["resumed_at"] == [stopped]
    assert_same_run(run_dir, ref)


@pytest.mark.slow  # a sweep's job processes
def test_a_sweep_stopped_by_sigterm_lists_the_run_as_interrupted_and_resumes_it(tmp_path, monkeypatch):
    """SIGTERM to the sweep command (SLURM preempting the job that runs it, say) goes on to the job,
    which checkpoints; the index says where it will resume, and the same command resumes it there."""
    monkeypatch.chdir(tmp_path)
    sweep_dir = tmp_path / "sw"
    common = [
        *tiny("train.threads=1", "train.steps=30", "train.checkpoint_every=10"),
        f"hydra.sweep.dir={sweep_dir}",
    ]
    grid = ["seed=0,1", *common]

    def stop_when_checkpointed():
        deadline = time.time() + 120
        while time.time() < deadline and not list(sweep_dir.glob("*/checkpoint.pt")):
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)  # this process runs the sweep command

    threading.Thread(target=stop_when_checkpointed, daemon=True).start()
    out = io.StringIO()
    code = run_sweep(grid, console=Console(file=out, width=200), poll_s=0.1)
    assert code == 128 + signal.SIGTERM, out.getvalue()
    assert "interrupted" in out.getvalue() and "run the same command again" in out.getvalue()
    rows = {r["status"]: r for r in read_index(sweep_dir)}
    interrupted = rows["interrupted"]
    step = int(interrupted["resume_step"])
    assert step >= 10 and "pending" in rows  # the basic launcher started no other job after it

    out = io.StringIO()
    run_sweep(grid, console=Console(file=out, width=200), dry_run=True)
    assert f"interrupted → resume at step {step}" in out.getvalue()
    code = run_sweep(grid, console=Console(file=io.StringIO(), width=200), poll_s=0.1)
    assert code == 0
    assert [r["status"] for r in read_index(sweep_dir)] == ["completed", "completed"]
    run_dir = sweep_dir / interrupted["run_dir"]
    assert summary(run_dir)["resumed_at"] == [step]
    seed = interrupted["overrides"].split("seed=")[1].split()[0]
    train_tiny(tmp_path / "ref", "train.threads=1", "train.steps=30", f"seed={seed}")
    assert_same_run(run_dir, tmp_path / "ref")


@pytest.mark.slow  # the CLI in a subprocess
def test_the_cli_refuses_another_configs_checkpoint_before_writing_anything(tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        signal_at(m, 5)
        from normbench.sweeps.job import run_job

        cfg = compose_cfg(tiny(*RUN))
        with pytest.raises(SystemExit) as exit_:
            run_job(cfg, str(tmp_path), multirun=False)
    assert exit_.value.code == 128 + signal.SIGTERM
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    result = run_cli("train", *tiny(*RUN, "train.lr=2e-3"), f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2 and "holds a checkpoint of another config" in result.stderr
    assert "Traceback" not in result.stderr
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert after == before  # nothing written, nothing lost

"""normbench sweep: Hydra's multirun through normbench's sweeper and the local, joblib and submitit
launchers; resume, index, dry-run, Ctrl-C."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY, compose_cfg, run_cli
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict
from rich.console import Console

from normbench.core.devices import available_cpus
from normbench.core.errors import ConfigError
from normbench.core.provenance import NUMERICS
from normbench.core.runs import RunDir, read_index
from normbench.sweeps import job as job_module
from normbench.sweeps.job import job_threads
from normbench.sweeps.sweep import plan_sweep, run_sweep
from normbench.training.config import conf_dir, config_hash, group_options

# Overrides under which train.lr=50 diverges within a few steps and train.lr=3e-3 does not.
HOT = [
    "norm=none",
    "train.warmup_steps=0",
    "train.grad_clip=0",
    "train.log_every=1",
    "train.diverge_threshold=6.0",
]


def sweep(args, **kwargs) -> tuple[int, str]:
    out = io.StringIO()
    code = run_sweep(list(args), console=Console(file=out, width=200), poll_s=0.2, **kwargs)
    return code, out.getvalue()


def summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def mtimes(run_dirs) -> dict:
    return {Path(d).name: (Path(d) / "summary.json").stat().st_mtime_ns for d in run_dirs}


@pytest.mark.slow  # sweeps through joblib's and the basic launcher's job processes
def test_grid_failures_index_and_resume(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep_dir = tmp_path / "sw"
    common = [*TINY, *HOT, f"hydra.sweep.dir={sweep_dir}"]
    grid = ["model.n_head=2,3", "train.lr=3e-3,50", *common]

    # joblib, two jobs at a time. lr=50 diverges; n_head=3 does not divide d_model, so those two
    # runs fail. Neither stops the sweep; a failure makes the exit code 1.
    code, out = sweep([*grid, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"])
    assert code == 1, out
    rows = read_index(sweep_dir)
    assert [r["job"] for r in rows] == ["0", "1", "2", "3"]
    assert sorted(r["status"] for r in rows) == ["completed", "diverged", "failed", "failed"]
    for r in rows:
        run_dir = sweep_dir / r["run_dir"]
        assert "model.n_head=" in r["overrides"] and "train.lr=" in r["overrides"]
        assert summary(run_dir)["config_hash"] == r["config_hash"]
        assert r["config_hash"].startswith(run_dir.name.rsplit("-", 1)[1])
        if r["status"] == "failed":
            assert "n_head" in r["error"] and (run_dir / "error.log").exists()
        else:
            assert summary(run_dir)["provenance"]["threads"] == max(
                1, available_cpus() // 2
            )  # the joblib threads rule
    assert "failed" in out and "diverged" in out and "index.csv" in out  # the closing table

    # Simulate a kill in the middle of the completed run: no summary, a torn metrics line.
    victim = next(sweep_dir / r["run_dir"] for r in rows if r["status"] == "completed")
    (victim / "summary.json").unlink()
    with open(victim / "metrics.jsonl", "a") as f:
        f.write('{"kind": "tra')
    kept = [sweep_dir / r["run_dir"] for r in rows if sweep_dir / r["run_dir"] != victim]
    before = mtimes(kept)
    _, out = run_sweep_dry(grid)
    assert "interrupted → run" in out and out.count("→ keep") == 3

    # The same sweep, reordered, through the basic launcher (one thread: the test machine is shared).
    code, out = sweep(["train.lr=3e-3,50", "model.n_head=2,3", *common, "train.threads=1"])
    assert code == 1, out  # the kept failures still count
    assert mtimes(kept) == before  # diverged and failed results are kept, not retried
    assert summary(victim)["status"] == "completed"
    records = [json.loads(line) for line in (victim / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 10, 20]  # one clean run, no leftovers
    assert len([d for d in sweep_dir.iterdir() if d.is_dir() and not d.name.startswith(".")]) == 4

    _, out = run_sweep_dry(grid, retry_failed=True)
    assert "diverged → run" in out and out.count("→ fail") == 2 and "completed → keep" in out
    done = mtimes(sweep_dir / r["run_dir"] for r in rows if r["status"] == "completed")
    retried = mtimes(sweep_dir / r["run_dir"] for r in rows if r["status"] != "completed")
    code, out = sweep([*grid, "train.threads=1"], retry_failed=True)
    assert code == 1, out
    assert mtimes(sweep_dir / name for name in done) == done  # completed runs are never retried
    after = mtimes(sweep_dir / name for name in retried)
    assert all(after[name] != retried[name] for name in retried)
    assert sorted(r["status"] for r in read_index(sweep_dir)) == ["completed", "diverged", "failed", "failed"]

    # Another command whose runs all exist in this sweep directory (found by config, not by
    # name or job number): nothing to run, and diverging is a result, so the exit code is 0.
    before = mtimes(sweep_dir / r["run_dir"] for r in rows)
    code, out = sweep(["train.lr=50,3e-3", *common])
    assert code == 0, out
    assert "2 have results (1 completed, 1 diverged), 0 to run" in out
    assert mtimes(sweep_dir / r["run_dir"] for r in rows) == before


def run_sweep_dry(args, **kwargs):
    return sweep(args, dry_run=True, **kwargs)


def sweep_children(parent: int) -> list[int]:
    """Processes started under the sweep command (they carry its pid in NORMBENCH_SWEEP_PARENT)."""
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"NORMBENCH_SWEEP_PARENT={parent}".encode() in environ.read_bytes().split(b"\0"):
                pids.append(int(environ.parent.name))
        except OSError:
            continue
    return pids


def process_state(pid: int) -> str | None:
    """A process's state letter from /proc (R running, S sleeping, Z zombie...), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    return process_state(pid) not in (None, "Z", "X")


def _where_they_wait(proc: subprocess.Popen, tmp_path: Path) -> str:
    """What a sweep that hangs is doing: each of its processes' state, then every thread's stack (under
    PYTHONFAULTHANDLER, SIGABRT dumps them into the child's output, which sweep.log holds) and the run
    directories' files."""
    lines = []
    pids = [proc.pid, *sweep_children(proc.pid)]
    for pid in pids:
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
            lines.append(f"{pid} {process_state(pid)} {cmd}")
    for pid in pids[1:]:  # one at a time: their stacks do not interleave in the log
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGABRT)
        time.sleep(1)
    for path in sorted(tmp_path.glob("results/sweeps/**/*")):
        if path.is_file():
            lines.append(f"{path.relative_to(tmp_path)} {path.stat().st_size}")
    for log in tmp_path.glob("results/sweeps/*/sweep.log"):
        lines.append(log.read_text(errors="replace")[-20000:])
    return "\n".join(lines)


def _wait_until_training(tmp_path: Path, proc: subprocess.Popen, finished: int) -> None:
    """Until `finished` runs have their summary and another run is training."""
    deadline = time.time() + 180
    while time.time() < deadline:
        dirs = [d for d in tmp_path.glob("results/sweeps/*/*-s*-*") if d.is_dir()]
        if sum((d / "summary.json").exists() for d in dirs) >= finished and any(
            (d / "metrics.jsonl").exists() and not (d / "summary.json").exists() for d in dirs
        ):
            return
        assert proc.poll() is None, "the sweep ended before it could be stopped"
        time.sleep(0.05)
    pytest.fail("the sweep never got going")


JOBLIB = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]


@pytest.mark.slow  # kill -9 of a sweep's processes
@pytest.mark.skipif(
    not Path("/proc/self/environ").exists(), reason="finds the sweep's processes through /proc"
)
@pytest.mark.parametrize("launcher", [[], JOBLIB], ids=["local", "joblib"])
def test_kill_9_mid_sweep_then_the_same_command_completes_every_run_once(tmp_path, launcher):
    args = ["sweep", "seed=0,1,2", *TINY, "train.steps=30", "train.threads=1", *launcher]
    proc = subprocess.Popen(
        [sys.executable, "-m", "normbench", *args],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_until_training(tmp_path, proc, finished=1)
        children = sweep_children(proc.pid)
        assert children, "Hydra's multirun runs in a child process"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.time() + 30
    while any(alive(pid) for pid in children) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in children), "jobs kept running after the sweep command was killed"
    finished = [d for d in tmp_path.glob("results/sweeps/*/*-s*-*") if (d / "summary.json").exists()]
    cut_short = [
        d
        for d in tmp_path.glob("results/sweeps/*/*-s*-*")
        if (d / "config.yaml").exists() and not (d / "summary.json").exists()
    ]
    before = mtimes(finished)

    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dirs = sorted(d for d in tmp_path.glob("results/sweeps/*/*-s*-*") if d.is_dir())
    assert len(run_dirs) == 3
    assert all(summary(d)["status"] == "completed" for d in run_dirs)
    assert mtimes(finished) == before  # what had finished was not trained again
    if cut_short:  # one per job the kill caught mid-run: joblib may have had two going
        assert f"{len(cut_short)} interrupted among them" in " ".join(result.stdout.split())


@pytest.mark.slow  # SIGINT to a sweep process
@pytest.mark.skipif(
    not Path("/proc/self/environ").exists(), reason="finds the sweep's processes through /proc"
)
@pytest.mark.parametrize("presses", [1, 2], ids=["once", "twice"])
def test_ctrl_c_stops_the_sweep_with_130_and_says_how_to_resume(tmp_path, presses):
    """The first Ctrl-C lets the running jobs stop (at a checkpoint, where the loop saves one); a second
    ends them at once. Either way one line says what finished, what was cut short and how to resume."""
    # Runs far longer than the test: however late the stop reaches a job, none can have finished.
    args = ["sweep", "seed=0,1", *TINY, "train.steps=50000", "train.threads=1", "hydra.launcher.n_jobs=2"]
    # A terminal's Ctrl-C reaches a process whose SIGINT is at its default, whatever the test runner's is
    # (a shell's background job inherits it ignored).
    proc = subprocess.Popen(
        [sys.executable, "-m", "normbench", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # a hang below is reported with every thread's stack
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _wait_until_training(tmp_path, proc, finished=0)
        children = sweep_children(proc.pid)
        assert children
        proc.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal sends
        if presses == 2:
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=180 if presses == 1 else 30)  # a loaded machine is slow
        except subprocess.TimeoutExpired:
            pytest.fail(f"the sweep did not end after Ctrl-C:\n{_where_they_wait(proc, tmp_path)}")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    line = " ".join(out.split())
    assert re.search(r"interrupted: 0 of 2 runs finished, [12] interrupted", line), out
    assert "resume with: normbench sweep seed=0,1" in line
    assert "Traceback" not in out + err
    assert not any(alive(pid) for pid in children), "jobs kept running after Ctrl-C"
    (sweep_dir,) = (tmp_path / "results" / "sweeps").iterdir()
    statuses = [r["status"] for r in read_index(sweep_dir)]
    assert "interrupted" in statuses and set(statuses) <= {"interrupted", "pending"}, (
        statuses
    )  # one may not have started
    assert not list(sweep_dir.glob("*/summary.json")), "an interrupted run is not a result"


def test_a_worker_whose_job_a_stop_ended_begins_no_job_queued_behind_it(monkeypatch):
    """The executor queues jobs ahead of the workers: the one that answered Ctrl-C in one job can take the
    next. That job ends at once with the same code instead of training on past the stop."""
    from normbench.sweeps import launching

    began = []

    def job(config, **kwargs):  # Hydra's run_job in a worker: one completes, the next is stopped by Ctrl-C
        began.append(config)
        if len(began) == 2:
            raise SystemExit(130)
        return "completed"

    monkeypatch.setattr(launching, "run_job", job)
    monkeypatch.setattr(launching, "_worker", {"hydra_context": None, "task_function": None})
    cfg = compose_hydra_cfg()
    assert launching._execute(cfg) == "completed"
    for _ in range(2):
        with pytest.raises(SystemExit) as stop:
            launching._execute(cfg)
        assert stop.value.code == 130
    assert len(began) == 2, "a job queued behind the stop began"


@pytest.mark.slow  # a sweep's job processes
def test_a_range_sweep_runs_one_job_per_value(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out = sweep(
        [
            "seed=range(3,5)",
            *TINY,
            "train.steps=4",
            "train.log_every=2",
            "train.eval_every=4",
            "train.threads=1",
        ]
    )
    assert code == 0, out
    (sweep_dir,) = (tmp_path / "results" / "sweeps").iterdir()
    rows = read_index(sweep_dir)
    assert [r["overrides"].split()[0] for r in rows] == ["seed=3", "seed=4"]
    assert [r["status"] for r in rows] == ["completed", "completed"]
    assert [OmegaConf.load(sweep_dir / r["run_dir"] / "config.yaml").seed for r in rows] == [3, 4]


def test_a_sweep_retrains_the_results_older_code_computed_and_says_so_in_one_line(tmp_path, monkeypatch):
    """Results stored under other numerics are run again (not kept); the sweep says how many and why."""
    from normbench.core import provenance

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(provenance, "NUMERICS", 2)
    args = ["norm=ln,rms", "seed=0,1", *TINY]
    jobs = plan_sweep(args).jobs
    for job, numerics in zip(jobs, (2, 1, 1, None)):
        RunDir(job.run_dir).write_config(compose_cfg(job.overrides))
        block = {} if numerics is None else {"provenance": {"numerics": numerics}}
        RunDir(job.run_dir).write_summary({"status": "completed", **block})  # no provenance: numerics 0
    code, out = run_sweep_dry(args)
    assert code == 0
    assert "1 has results (1 completed), 3 to run" in out
    lines = [line for line in out.splitlines() if "retraining" in line]
    assert lines == ["retraining 3 runs stored by older code (numerics 0, 1, now 2)"]
    assert out.count("completed → keep") == 1 and out.count("new → run") == 3


@pytest.mark.slow  # the CLI in a subprocess
def test_dry_run_lists_runs_and_their_results(tmp_path, monkeypatch):
    args = ["norm=ln,rms", "seed=0,1", *TINY]
    result = run_cli("sweep", "--dry-run", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "4 runs in results/sweeps/grid-" in out and "none has results yet, 4 to run" in out
    assert not (tmp_path / "results").exists(), "a dry run writes nothing"

    monkeypatch.chdir(tmp_path)
    jobs = plan_sweep(args).jobs
    # Results as runs leave them; the job's config composed separately must hash the same.
    for job, status in zip(jobs, ("completed", "diverged", None)):
        cfg = compose_cfg(job.overrides)
        assert config_hash(cfg) == job.config_hash
        RunDir(job.run_dir).write_config(cfg)
        if status:
            RunDir(job.run_dir).write_summary({"status": status, "provenance": {"numerics": NUMERICS}})
    code, out = run_sweep_dry(args)
    assert code == 0
    assert "4 runs in results/sweeps/grid-" in out
    assert "2 have results (1 completed, 1 diverged), 2 to run (1 interrupted among them)" in out
    assert "completed → keep" in out and "diverged → keep" in out and "interrupted → run" in out
    assert "new → run" in out
    _, out = run_sweep_dry(args, retry_failed=True)
    assert "diverged → run" in out


def test_same_sweep_dir_whatever_the_order_of_overrides_or_the_launcher(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = plan_sweep(["norm=ln,rms", "seed=0,1", "train.steps=20"])
    b = plan_sweep(["train.steps=20", "seed=0,1", "norm=ln,rms", "hydra/launcher=joblib", "train.threads=1"])
    c = plan_sweep(["norm=ln,rms", "seed=0,1", "train.steps=30"])
    assert a.sweep_dir == b.sweep_dir != c.sweep_dir
    assert a.sweep_dir.parent == Path("results/sweeps") and a.sweep_dir.name.startswith("grid-")
    assert sorted(j.run_dir for j in a.jobs) == sorted(j.run_dir for j in b.jobs)
    assert a.varying == ["norm", "seed"]
    # 1e-3 and 0.001 are the same config: the same run directory.
    assert (
        plan_sweep(["train.lr=1e-3"]).jobs[0].run_dir.name
        == plan_sweep(["train.lr=0.001"]).jobs[0].run_dir.name
    )
    custom = plan_sweep(["norm=ln,rms", "hydra.sweep.dir=elsewhere"])
    assert custom.sweep_dir == Path("elsewhere")
    assert {job.run_dir.parent for job in custom.jobs} == {Path("elsewhere")}


def test_named_experiments_plan_their_grids(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sizes = {
        "norm_zoo": 192,
        "warmup": 60,
        "depth": 81,
        "precision": 8,
        "batch_size": 18,
        "lr_sensitivity": 90,
        "qk_norm": 64,
        "modern_placements": 12,
        "tokens": 90,
        "width": 288,
        "modern_zoo": 108,
        "ladder": 180,
        "rezero": 12,
        "ln_scaling": 8,
        "grad_profile": 6,
        "vocab": 144,
    }  # as docs/experiments.md says
    assert set(group_options("experiment")) == set(sizes)
    for name, size in sizes.items():
        params = OmegaConf.load(conf_dir() / "experiment" / f"{name}.yaml").hydra.sweeper.params
        n = math.prod(
            len(group_options(k)) if v == "glob(*)" else len(str(v).split(",")) for k, v in params.items()
        )
        assert n == size, name
    # Composing every job is Hydra's slow part: plan one slice of each grid, every axis but one.
    for args, n in [
        (["experiment=norm_zoo", "seed=0", "placement=pre", "train.lr=1e-2"], 8),
        (["experiment=warmup", "placement=post", "seed=0", "train.lr=1e-2"], 2),
        (["experiment=depth", "placement=deepnorm", "seed=0", "train.lr=1e-2"], 3),
        (["experiment=lr_sensitivity", "placement=pre", "seed=0", "train.lr=1e-2"], 3),
        (["experiment=precision", "seed=0"], 4),
        (["experiment=batch_size", "seed=0", "norm=bn"], 3),
        (["experiment=tokens", "norm=dyt", "seed=0", "train.lr=1e-2"], 5),
        (["experiment=width", "norm=rms", "placement=pre", "seed=0", "train.lr=1e-2"], 6),
        (["experiment=modern_zoo", "seed=0", "train.lr=1e-2"], 6),
        (["experiment=vocab", "data.source=x.txt", "norm=ln", "placement=pre", "seed=0", "train.lr=1e-2"], 6),
    ]:
        plan = plan_sweep(args)
        assert len(plan.jobs) == n and not any(j.invalid for j in plan.jobs), args
        assert plan.sweep_dir.name.startswith(args[0].split("=")[1] + "-")
    zoo = plan_sweep(["experiment=norm_zoo", "seed=0", "placement=pre", "train.lr=1e-2"])
    assert {j.overrides[0] for j in zoo.jobs} == {f"norm={n}" for n in group_options("norm")}  # glob(*)


@pytest.mark.slow  # the CLI in a subprocess
def test_user_mistakes_are_short_clear_errors(tmp_path, monkeypatch):
    result = run_cli("sweep", "experiment=warmpu", cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown experiment 'warmpu'; did you mean warmup? (choices: " in result.stderr
    assert "norm_zoo" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout

    monkeypatch.chdir(tmp_path)
    for args, message in [
        (["norm=nope"], "unknown norm 'nope'; did you mean none? (choices: bn,"),
        (["nokey=1"], "unknown key nokey"),
        (["norm=[ln"], "cannot read the override 'norm=[ln'"),
        (["experiment=warmup,depth"], "one experiment per sweep"),
        (["train.lr=-1"], "train.lr must be >= 0"),
        (["train.lr=1e-3,0.001"], "jobs 0 and 1 are the same config"),
    ]:
        with pytest.raises(ConfigError) as err:
            plan_sweep(args)
        assert message in str(err.value), (args, err.value)
    assert not (tmp_path / "results").exists()


def test_launcher_presets_compose(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from normbench.core.errors import installed as _has_module

    if _has_module("hydra_plugins.hydra_submitit_launcher"):
        assert (
            len(plan_sweep(["norm=ln,rms", "hydra/launcher=slurm", "hydra.launcher.partition=gpu"]).jobs) == 2
        )
    if _has_module("hydra_plugins.hydra_ray_launcher"):
        assert len(plan_sweep(["norm=ln,rms", "hydra/launcher=ray_cluster"]).jobs) == 2
    else:
        with pytest.raises(ConfigError, match=r"pip install 'normbench\[ray\]'"):
            plan_sweep(["norm=ln,rms", "hydra/launcher=ray_cluster"])


@pytest.mark.slow  # submitit's local (SLURM-like) executor processes
@pytest.mark.skipif(
    not __import__("importlib").util.find_spec("hydra_plugins.hydra_submitit_launcher"),
    reason="hydra-submitit-launcher is not installed (pip install 'normbench[slurm]')",
)
def test_submitit_local_launcher(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out = sweep(
        [
            "norm=ln,rms",
            *TINY,
            "hydra/launcher=submitit_local",
            "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.timeout_min=5",
        ]
    )
    assert code == 0, out
    (sweep_dir,) = (tmp_path / "results" / "sweeps").iterdir()
    rows = read_index(sweep_dir)
    assert [r["status"] for r in rows] == ["completed", "completed"]
    assert all(summary(sweep_dir / r["run_dir"])["provenance"]["threads"] == 1 for r in rows)


def test_job_threads_rule(monkeypatch):
    monkeypatch.setattr("normbench.core.devices.available_cpus", lambda: 16)
    assert job_threads({"n_jobs": 4}) == 4
    assert job_threads({"n_jobs": 32}) == 1
    assert job_threads({"n_jobs": -1}) == 1
    assert job_threads({"n_jobs": -2}) == 1  # 15 jobs on 16 cpus
    assert job_threads({"cpus_per_task": 8}) == 8  # submitit
    assert job_threads({"ray": {"remote": {"num_cpus": 4}}}) == 4
    assert job_threads({}) == 0  # basic launcher: torch's default


def test_config_hash_ignores_where_and_how_a_run_goes():
    base = config_hash(compose_cfg(TINY))
    assert (
        config_hash(compose_cfg([*TINY, "results_dir=/elsewhere", "train.threads=3", "train.progress=true"]))
        == base
    )
    assert config_hash(compose_cfg([*TINY, "seed=1"])) != base


def test_a_crash_outside_the_training_loop_fails_the_job_not_the_sweep(tmp_path, monkeypatch):
    cfg = compose_cfg(TINY)
    HydraConfig.instance().set_config(compose_hydra_cfg())

    def boom(*args, **kwargs):
        raise RuntimeError("out of disk")

    monkeypatch.setattr("normbench.training.loop.train", boom)
    assert job_module.run_job(cfg, str(tmp_path), multirun=True) is None
    s = summary(tmp_path)
    assert s["status"] == "failed" and s["error"] == "RuntimeError: out of disk"
    assert s["config_hash"] == config_hash(cfg)
    assert "Traceback" in (tmp_path / "error.log").read_text()
    with pytest.raises(SystemExit) as exit_:  # a single run ends with exit code 1, the traceback in error.log
        job_module.run_job(cfg, str(tmp_path / "single"), multirun=False)
    assert exit_.value.code == 1
    assert "Traceback" in (tmp_path / "single" / "error.log").read_text()


def compose_hydra_cfg():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from normbench.training.config import conf_dir

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(TINY), return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = "unused"
    return cfg


@pytest.mark.slow  # a sweep's job processes
def test_a_failed_run_of_another_grid_is_indexed_and_leaves_this_grids_exit_code_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep_dir = tmp_path / "sw"
    other = sweep_dir / "old-grid-run"
    (other / ".hydra").mkdir(parents=True)
    (other / ".hydra" / "overrides.yaml").write_text("- model.n_head=3\n")
    (other / "config.yaml").write_text("seed: 0\n")
    (other / "summary.json").write_text(json.dumps({"status": "failed", "error": "n_head=3"}))
    code, out = sweep([*TINY, *HOT, "train.steps=2", f"hydra.sweep.dir={sweep_dir}"])
    assert code == 0, out
    assert "1 run: 1 completed" in out
    rows = {r["run_dir"]: r for r in read_index(sweep_dir)}
    assert rows["old-grid-run"]["status"] == "failed" and rows["old-grid-run"]["job"] == ""
    assert [r["status"] for d, r in rows.items() if d != "old-grid-run"] == ["completed"]

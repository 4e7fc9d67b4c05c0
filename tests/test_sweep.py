"""normbench sweep: Hydra's multirun through normbench's sweeper and the local, joblib and submitit
launchers; resume, index, dry-run, Ctrl-C."""

from __future__ import annotations

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
from conftest import TINY, compose_cfg, run_cli, tiny
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict
from rich.console import Console
from typer.testing import CliRunner

from normbench.cli import app
from normbench.core.devices import available_cpus
from normbench.core.errors import ConfigError
from normbench.core.provenance import NUMERICS
from normbench.core.runs import RunDir, read_index
from normbench.sweeps import job as job_module
from normbench.sweeps.job import job_threads
from normbench.sweeps.sweep import plan_sweep, run_sweep, training_share
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


def _sweep_children(parent: int) -> list[int]:
    """Processes started under the sweep command (they carry its pid in NORMBENCH_SWEEP_PARENT)."""
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"NORMBENCH_SWEEP_PARENT={parent}".encode() in environ.read_bytes().split(b"\0"):
                pids.append(int(environ.parent.name))
        except OSError:
            continue
    return pids


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] not in "ZX"
    except (OSError, IndexError):
        return False


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
        children = _sweep_children(proc.pid)
        assert children, "Hydra's multirun runs in a child process"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.time() + 30
    while any(_alive(pid) for pid in children) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in children), "jobs kept running after the sweep command was killed"
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
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _wait_until_training(tmp_path, proc, finished=0)
        children = _sweep_children(proc.pid)
        assert children
        proc.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal sends
        if presses == 2:
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=180 if presses == 1 else 30)  # a loaded machine is slow
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    line = " ".join(out.split())
    assert re.search(r"interrupted: 0 of 2 runs finished, [12] interrupted", line), out
    assert "resume with: normbench sweep seed=0,1" in line
    assert "Traceback" not in out + err
    assert not any(_alive(pid) for pid in children), "jobs kept running after Ctrl-C"
    (sweep_dir,) = (tmp_path / "results" / "sweeps").iterdir()
    statuses = [r["status"] for r in read_index(sweep_dir)]
    assert "interrupted" in statuses and set(statuses) <= {"interrupted", "pending"}, (
        statuses
    )  # one may not have started
    assert not list(sweep_dir.glob("*/summary.json")), "an interrupted run is not a result"


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


@pytest.mark.parametrize(
    "remote, nodes, fits",
    [
        ({"num_cpus": 4, "num_gpus": 1}, [{"CPU": 2.0, "GPU": 0.0}, {"CPU": 64.0}], False),
        ({"num_cpus": 4, "num_gpus": 1}, [{"CPU": 2.0}, {"CPU": 8.0, "GPU": 1.0}], True),
        ({"num_cpus": 2, "num_gpus": 0}, [{"CPU": 2.0, "GPU": 0.0}], True),
        ({"num_cpus": None, "num_gpus": None}, [{"CPU": 1.0}], True),  # Ray's defaults: 1 CPU, no GPU
        ({"num_cpus": 1, "num_gpus": 0}, [], False),  # a cluster without a live node
    ],
)
def test_ray_preflight_compares_each_runs_request_with_the_largest_node(remote, nodes, fits):
    from normbench.sweeps.sweep import too_large_for_every_node

    refusal = too_large_for_every_node(remote, nodes, "10.0.0.1:6379")
    assert (refusal is None) == fits
    if not fits:
        assert "no run could ever start; set hydra.launcher.ray.remote.num_" in refusal


def test_the_live_view_says_runs_not_started_under_ray_wait_for_its_resources():
    from normbench.sweeps.sweep import RAY_LAUNCHER, waiting_for_ray

    ray = {"_target_": RAY_LAUNCHER, "ray": {"remote": {"num_cpus": 4, "num_gpus": 1}}}
    assert (
        waiting_for_ray(ray, 3)
        == " · 3 waiting for Ray to free 4 CPUs and 1 GPU on a node (hydra.launcher.ray.remote)"
    )
    assert waiting_for_ray({"_target_": RAY_LAUNCHER, "ray": {"remote": {}}}, 1) == (
        " · 1 waiting for Ray to free 1 CPU on a node (hydra.launcher.ray.remote)"
    )  # Ray's defaults
    assert waiting_for_ray(ray, 0) == ""
    assert (
        waiting_for_ray({"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"}, 3)
        == ""
    )
    assert waiting_for_ray(None, 3) == ""


class CountingLoader:
    """A config loader that counts the compositions it is asked for (Hydra's own, passed through)."""

    def __init__(self, loader):
        self.loader, self.composed = loader, []

    def load_sweep_config(self, master, overrides):
        self.composed.append(list(overrides))
        return self.loader.load_sweep_config(master, overrides)

    def __getattr__(self, name):
        return getattr(self.loader, name)


def test_composing_once_per_choice_of_groups_gives_hydras_own_config_for_every_job(monkeypatch, tmp_path):
    """normbench.sweeps.composing composes once per choice of groups and applies key changes itself: every
    job's whole config (the hydra node included) must be what Hydra composes for that job, and the
    launcher, composing after the plan in the same process, composes nothing again."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    from normbench.sweeps import composing
    from normbench.sweeps.planning import grid

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(composing, "_bases", {})
    args = [
        "norm=ln,gn",
        "placement=pre,mixln",
        "train.lr=1e-3,0.01",
        "seed=0,1",
        "model=micro",
        "model.qk_norm=rms",
        "train.steps=7",
        "hydra.launcher.n_jobs=2",
    ]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3", job_name="normbench"):
        hydras = GlobalHydra.instance().config_loader()
        loader = CountingLoader(hydras)
        master = hydras.load_configuration("config", [*args, "hydra.mode=MULTIRUN"], RunMode.MULTIRUN)
        jobs = grid(
            OverridesParser.create(config_loader=hydras).parse_overrides(list(master.hydra.overrides.task))
        )
        assert len(jobs) == 16
        # The grid's jobs (the fast way), one with a + override and one with a key the config lacks
        # (Hydra's way).
        for job in [*jobs, [*jobs[0], "+train.extra=1"]]:
            fast, slow = composing.compose(loader, master, job), hydras.load_sweep_config(master, job)
            assert OmegaConf.to_container(fast) == OmegaConf.to_container(slow)
        with pytest.raises(Exception, match="Could not override 'train.extra'"):
            composing.compose(loader, master, [*jobs[0], "train.extra=1"])
        assert len(composing._bases) == 4  # 2 norms x 2 placements: each choice of groups composed once
        loader.composed.clear()
        for job in jobs:  # the launcher, after the plan
            composing.compose(loader, master, job)
        assert loader.composed == []
    GlobalHydra.instance().clear()


def test_checking_a_config_again_gives_it_its_own_typed_groups():
    """parse_config reuses the typed groups of a config it has checked (a sweep's plan checks every
    job), never the objects: a job changes its own (train.progress, train.threads)."""
    from normbench.training.config import parse_config

    cfg = compose_cfg(TINY)
    first = parse_config(cfg)
    first.train.lr, first.model.n_layer = 123.0, 9
    again = parse_config(cfg)
    assert again.train.lr == cfg.train.lr and again.model.n_layer == cfg.model.n_layer
    for _ in range(2):  # a mistake is never remembered as a config
        with pytest.raises(ConfigError, match="model.n_layer"):
            parse_config(compose_cfg([*TINY, "model.n_layer=many"]))


def test_a_sweep_subdir_that_reads_hydras_job_config_is_planned_as_hydra_names_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = plan_sweep(["seed=0,1", *TINY, "hydra.sweep.subdir=job${hydra:job.num}"])
    assert [job.run_dir.name for job in plan.jobs] == ["job0", "job1"]


@pytest.mark.slow  # the local launcher's workers
@pytest.mark.skipif(
    not Path("/proc/self/environ").exists(), reason="finds the sweep's processes through /proc"
)
def test_the_local_launchers_warm_workers_run_every_job_and_are_gone_when_the_sweep_ends(
    tmp_path, monkeypatch
):
    """hydra/launcher=local starts n_jobs workers of its own, before the sweeper plans; they run every job
    (each run's lock records the process that trained it), their output reaches sweep.log, and no
    worker outlives the sweep."""
    from normbench.core.runs import RunLock

    monkeypatch.chdir(tmp_path)
    code, out = sweep(
        ["seed=0,1,2", *TINY, "train.steps=5", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={tmp_path / 's'}"]
    )
    assert code == 0, out
    log = (tmp_path / "s" / "sweep.log").read_text()
    owners = {RunLock(d).last_owner()["pid"] for d in (tmp_path / "s").glob("*-s*-*")}
    assert 1 <= len(owners) <= 2, owners
    assert log.count("run completed") == 3  # each job's summary table, printed in a worker
    assert not any(_alive(pid) for pid in owners), "the launcher's workers outlived the sweep"


@pytest.mark.slow  # a planning child and its warming workers
@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="multiprocessing's semaphores live in /dev/shm")
def test_a_sweep_that_is_not_needed_goes_with_its_warming_workers_and_leaves_nothing_behind(
    tmp_path, monkeypatch
):
    """When the sweep command abandons the multirun (a mistake, nothing to run, Ctrl-C while it plans),
    the child and the workers it is warming go at once, leaving nothing in /dev/shm."""
    from normbench.sweeps import multirun

    monkeypatch.chdir(tmp_path)
    shm = set(os.listdir("/dev/shm"))
    child = multirun.start([*TINY, "hydra.launcher.n_jobs=2"])

    def its_group() -> list[int]:  # the child leads a process group of its own: its workers are in it
        pids = []
        for pid in _sweep_children(os.getpid()):
            try:
                if os.getpgid(pid) == child.pid:
                    pids.append(pid)
            except ProcessLookupError:
                continue
        return pids

    deadline = time.time() + 120
    while len(its_group()) < 3 and time.time() < deadline:
        time.sleep(0.1)  # the child and its two workers
    started = its_group()
    assert len(started) >= 3, "the child never started its workers"
    multirun.abandon(child)
    deadline = time.time() + 30
    while any(_alive(pid) for pid in started) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in started)
    left = {name for name in set(os.listdir("/dev/shm")) - shm if str(child.pid) in name}
    assert not left, left


def test_the_multirun_child_never_imports_torch():
    """The sweep command starts the child first thing: what it imports to start
    (normbench.sweeps.multirun, normbench.sweeps.job for Hydra's task function) must not load PyTorch,
    a second of CPU."""
    code = "import sys, normbench.sweeps.multirun, normbench.sweeps.job; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_a_configs_identity_is_what_it_was_when_its_runs_were_stored(tmp_path, monkeypatch):
    """config_hash names run directories: the same config must hash the same across releases, or a
    sweep run again would not find its results (these two were stored by normbench 6df1fde)."""
    monkeypatch.chdir(tmp_path)
    plan = plan_sweep(["experiment=lr_sensitivity"])
    hashes = {" ".join(job.overrides): job.config_hash for job in plan.jobs}
    assert (
        hashes["norm=ln placement=pre train.lr=0.001 seed=0 experiment=lr_sensitivity"] == "cac3d1c006085bd2"
    )
    assert (
        hashes["norm=rms placement=pre train.lr=0.1 seed=2 experiment=lr_sensitivity"] == "cfaf040d04cfd7d1"
    )


@pytest.mark.parametrize(
    "args, sweep_dir, jobs, digest, last",
    [
        (
            ["experiment=lr_sensitivity"],
            "lr_sensitivity-ca9d4cbb",
            90,
            "7011254e99be2c3b",
            "none-post-s2-9ba4950f",
        ),
        (
            ["norm=ln,rms,bn,gn", "placement=pre,post,peri", "train.lr=1e-3,1e-2", "seed=0,1", "model=micro"],
            "grid-2fa099dc",
            48,
            "928527e8815ee698",  # peri's jobs: their config gained placement.embedding_norm (numerics 3)
            "gn-peri-s1-164fe1b5",
        ),
    ],
    ids=["lr_sensitivity", "grid48"],
)
def test_a_sweep_plans_the_run_directories_and_hashes_it_always_did(
    tmp_path, monkeypatch, args, sweep_dir, jobs, digest, last
):
    """The sweep and run directory names and config hashes, job by job, that the plan made before normbench
    had its own Hydra plugins (94fe8bb, Hydra's basic sweeper): a sweep run again finds its results."""
    import hashlib

    monkeypatch.chdir(tmp_path)
    plan = plan_sweep(args)
    lines = "\n".join(f"{job.run_dir.name} {job.config_hash}" for job in plan.jobs)
    assert plan.sweep_dir == Path("results/sweeps") / sweep_dir
    assert len(plan.jobs) == jobs and plan.jobs[-1].run_dir.name == last
    assert hashlib.sha256(lines.encode()).hexdigest()[:16] == digest


def test_only_the_placements_whose_computation_changed_got_new_run_directories(tmp_path, monkeypatch):
    """peri's config gained placement.embedding_norm: its jobs are new runs; every other job keeps the
    directory and hash it had before (digest of the non-peri jobs, as 94fe8bb's plan made them)."""
    import hashlib

    monkeypatch.chdir(tmp_path)
    plan = plan_sweep(
        ["norm=ln,rms,bn,gn", "placement=pre,post,peri", "train.lr=1e-3,1e-2", "seed=0,1", "model=micro"]
    )
    kept = [job for job in plan.jobs if "-peri-" not in job.run_dir.name]
    lines = "\n".join(f"{job.run_dir.name} {job.config_hash}" for job in kept)
    assert len(kept) == 32 and hashlib.sha256(lines.encode()).hexdigest()[:16] == "f6f371191ff8c6ad"


def test_the_sweep_command_forwards_every_signal_a_job_checkpoints_on():
    """The sweep command names the stop signals itself (it must not import PyTorch); they must be the
    ones the training loop checkpoints on, or a preempted sweep's jobs would die without a checkpoint."""
    from normbench.sweeps.multirun import STOP_SIGNALS
    from normbench.training.preemption import SIGNALS

    assert STOP_SIGNALS == SIGNALS


def test_the_closing_line_says_the_training_share_in_words():
    # two runs of 34 s of training steps each, on 2 workers for 40 s: 68 of 80 worker-seconds
    assert (
        training_share([34.0, 34.0], 2, 40.0)
        == "; 85% of the workers' time was training (2 workers for 40 s)"
    )
    assert training_share([9.0], 1, 10.0) == "; 90% of the workers' time was training (1 worker for 10 s)"


def test_a_sweep_directory_with_runs_of_another_grid_says_so(tmp_path):
    sweep = tmp_path / "demo"
    other = CliRunner().invoke(
        app, ["train", *tiny("train.steps=2", "seed=7"), f"hydra.run.dir={sweep / 'old'}"]
    )
    assert other.exit_code == 0, other.output
    args = ["sweep", "--dry-run", *tiny("seed=0,1"), f"hydra.sweep.dir={sweep}"]
    planned = " ".join(CliRunner().invoke(app, args).output.split())
    assert (
        f"{sweep} holds 1 run of another grid; it is kept (normbench report {sweep} compares them too)"
        in planned
    )
    fresh = " ".join(
        CliRunner().invoke(app, [*args[:-1], f"hydra.sweep.dir={tmp_path / 'new'}"]).output.split()
    )
    assert "another grid" not in fresh and "2 runs in" in fresh

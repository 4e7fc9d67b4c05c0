"""How a sweep is planned and launched: composing each job as Hydra would, configs' identities across
versions, the Ray preflight, the local launcher's warm workers, and what the sweep command says."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY, compose_cfg, tiny
from omegaconf import OmegaConf
from test_sweep import alive, sweep, sweep_children
from typer.testing import CliRunner

from normbench.cli import app
from normbench.core.errors import ConfigError
from normbench.sweeps.sweep import plan_sweep, training_share
from normbench.training.config import conf_dir


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
    assert not any(alive(pid) for pid in owners), "the launcher's workers outlived the sweep"


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
        for pid in sweep_children(os.getpid()):
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
    while any(alive(pid) for pid in started) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in started)
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
            "2579584cfdb0c203",  # post's jobs: Post-LN's own recipe (BERT's init, a head of its own)
            "none-post-s2-168354bc",
        ),
        (
            ["norm=ln,rms,bn,gn", "placement=pre,post,peri", "train.lr=1e-3,1e-2", "seed=0,1", "model=micro"],
            "grid-2fa099dc",
            48,
            # peri's jobs: their config gained placement.embedding_norm (numerics 3); post's: its own recipe
            "97921fb422263974",
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
    """peri's config gained placement.embedding_norm and post its own recipe (BERT's init, a head of its
    own): their jobs are new runs; every other job keeps the directory and hash it had before (digest of
    the other jobs, as 94fe8bb's plan made them, and 614ddce's)."""
    import hashlib

    monkeypatch.chdir(tmp_path)
    plan = plan_sweep(
        ["norm=ln,rms,bn,gn", "placement=pre,post,peri", "train.lr=1e-3,1e-2", "seed=0,1", "model=micro"]
    )
    kept = [job for job in plan.jobs if "-peri-" not in job.run_dir.name and "-post-" not in job.run_dir.name]
    lines = "\n".join(f"{job.run_dir.name} {job.config_hash}" for job in kept)
    assert len(kept) == 16 and hashlib.sha256(lines.encode()).hexdigest()[:16] == "ad9b2e169bb0e71c"


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


def test_the_training_share_after_a_resume_is_at_most_100_percent():
    # a resumed run's summary counts 246 s of steps, most of them trained before this 100 s sweep
    assert (
        training_share([246.0], 1, 100.0) == "; 100% of the workers' time was training (1 worker for 100 s)"
    )
    assert training_share([246.0, 30.0], 2, 100.0).startswith("; 65% of")  # (100 + 30) / 200


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

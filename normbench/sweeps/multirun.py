"""Hydra's multirun in a child process of ``normbench sweep``: started first, warmed, then told what to run.

``normbench.sweeps.sweep`` plans a sweep and watches it; its jobs run in Hydra's multirun in a child
process (its own process group, so that Ctrl-C or the death of the sweep command stops every
job; its output goes to sweep.log). The child starts before the plan is made, with the user's
overrides: while the sweep command composes and checks every job, the child imports PyTorch and
Hydra, starts the launcher's workers and pays what a process's first run pays once
(``warm_launcher``). It then reads one line from stdin: the multirun's arguments (``launch``),
or nothing when the plan refused the overrides or found nothing to run (``abandon``). Its
output, and its workers', comes through a pipe that the sweep command copies into sweep.log
(``copy_output``): the workers start before the sweep directory is known.
docs/benchmarks.md#sweep-efficiency has what this saves.

This module imports neither PyTorch nor Hydra, so that the sweep command can start the child first.
"""

from __future__ import annotations

import base64
import gc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from normbench.core.configtree import conf_dir
from normbench.core.runs import SWEEP_ENV
from normbench.sweeps.composing import SHARED_ENV

PARENT_ENV = "NORMBENCH_SWEEP_PARENT"
WARM_ENV = "NORMBENCH_SWEEP_WARM"  # the child warms up, then reads what to run from stdin
WARMED = "[normbench] warmed while the sweep was planned, pids:"  # sweep.log's line
BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
JOBLIB_LAUNCHER = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"


def sweep_owner() -> str:
    """The sweep command, as its jobs' run locks record it."""
    return f"{os.getpid()}@{socket.gethostname()}"


# ----------------------------------------------------------------------------- in the sweep command


def start(overrides: list[str]) -> subprocess.Popen | None:
    """Start the child, warming up for these overrides; None if it cannot start (``launch`` tries again)."""
    try:
        return subprocess.Popen(
            _command(overrides),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**_env(), WARM_ENV: "1"},
            start_new_session=True,
        )
    except OSError:
        return None


def launch(warm: subprocess.Popen | None, args: list[str], composed: bytes = b"") -> subprocess.Popen:
    """The running multirun over ``args``: the warm child told so, else (none, or it is gone) a new child.
    ``composed``: the plan's composed configs (normbench.sweeps.composing.shared_bytes), for the warm
    child's workers."""
    if warm is not None and warm.poll() is None:
        go = {"args": args, "composed": base64.b64encode(composed).decode()}
        # Written from a thread: the child reads it once warm, and the line is larger than a pipe
        # holds; the watch starts meanwhile (and sees the child end, should it die warming up).
        threading.Thread(target=_tell, args=(warm, (json.dumps(go) + "\n").encode()), daemon=True).start()
        return warm
    abandon(warm)
    return subprocess.Popen(
        _command(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(), start_new_session=True
    )


def _tell(warm: subprocess.Popen, line: bytes) -> None:
    try:
        warm.stdin.write(line)
        warm.stdin.close()
    except OSError:  # it died warming up: its exit code and sweep.log say so
        pass


def copy_output(proc: subprocess.Popen, log: Path) -> threading.Thread:
    """Append the child's output (its workers' too) to ``log`` as it comes, until all of them close it."""

    def copy() -> None:
        with open(log, "ab") as out:
            while chunk := os.read(proc.stdout.fileno(), 1 << 16):
                out.write(chunk)
                out.flush()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def abandon(warm: subprocess.Popen | None) -> None:
    """Nothing to launch (the plan refused the overrides or found nothing to run): the child stops
    warming up and exits, and takes its workers with it (a SIGTERM it handles: killed, it would
    leave the workers and their semaphores behind)."""
    if warm is None:
        return
    if warm.poll() is None:
        warm.terminate()
        try:
            warm.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(warm.pid, signal.SIGKILL)
            warm.wait()
    for pipe in (warm.stdin, warm.stdout):
        if pipe:
            pipe.close()


def stop(proc: subprocess.Popen) -> None:
    """Ctrl-C: interrupt the whole job tree (its own process group), then kill what is left."""
    for sig, wait in ((signal.SIGINT, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue


def _command(args: list[str]) -> list[str]:
    return [sys.executable, "-c", "from normbench.sweeps.multirun import main; main()", *args]


def _env() -> dict:
    env = {**os.environ, PARENT_ENV: str(os.getpid()), SWEEP_ENV: sweep_owner()}
    root = Path(__file__).resolve().parents[2]
    if conf_dir() == root / "conf":  # a source checkout: the child must import this very normbench
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    return env


# ----------------------------------------------------------------------------- in the child


def main() -> None:
    """The child: Hydra's own multirun over normbench.sweeps.job.hydra_main (warmed up first under
    WARM_ENV)."""
    parent = int(os.environ.get(PARENT_ENV) or 0)
    if parent:
        threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    if os.environ.pop(WARM_ENV, None):
        # Until it is told what to run, SIGTERM (``abandon``) ends the child the orderly way:
        # joblib stops the workers and frees their resources.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
        # Where the plan's composed configs will be, for the workers about to start (they read it
        # at their first job): a directory of this process's own.
        shared = tempfile.mkdtemp(prefix="normbench-sweep-")
        os.environ[SHARED_ENV] = os.path.join(shared, "composed.pickle")
        try:
            _run_when_told(warm_launcher(sys.argv[1:]))
        finally:
            shutil.rmtree(shared, ignore_errors=True)
    else:
        _run()


def _run_when_told(warmed: list[int]) -> None:
    from normbench.sweeps import composing

    line = sys.stdin.readline()
    if not line:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    go = json.loads(line)
    if go["composed"]:
        composing.share(base64.b64decode(go["composed"]))
    sys.argv = [sys.argv[0], *go["args"]]
    if warmed:
        print(f"{WARMED} {' '.join(map(str, sorted(set(warmed))))}", flush=True)
    _run()


def _run() -> None:
    """Hydra's multirun, as the arguments say."""
    _LAUNCHED.set()
    from normbench.sweeps.job import (
        hydra_main,
    )  # installs normbench.sweeps.composing, for the launcher's per-job composition

    leave_batch_check_to_the_plan()
    try:
        hydra_main()
    finally:
        _stop_idle_workers()
        gc.freeze()  # as normbench.cli.main does: no last collection over PyTorch's import-time objects


def leave_batch_check_to_the_plan() -> None:
    """The plan (normbench.sweeps.sweep.plan_sweep) composed and checked every job of the grid before
    launching it: Hydra's sweeper composing them all once more, before the first job starts, only
    keeps the workers waiting. (Patched on the base class: Hydra's plugin scan executes
    basic_sweeper.py again, which makes a new BasicSweeper class.)"""
    from hydra.plugins.sweeper import Sweeper

    Sweeper.validate_batch_is_legal = lambda self, batch: None


def _stop_idle_workers() -> None:
    """Every job has returned: joblib's idle workers are killed rather than waited for at exit
    (each would take most of a second to tear PyTorch down). joblib keeps its one executor in
    loky's module; ``terminate`` frees its resources too."""
    from joblib.externals.loky import reusable_executor

    executor = getattr(reusable_executor, "_executor", None)
    if executor is not None and hasattr(executor, "terminate"):
        executor.terminate(kill_workers=True)


def warm_launcher(overrides: list[str]) -> list[int]:
    """Before the plan is made: start the launcher's workers and warm them
    (``normbench.sweeps.job.warm_worker``), so that the first jobs need not wait for imports. joblib's
    workers are started with the very arguments Hydra's joblib launcher gives ``joblib.Parallel``, so
    that it finds them running and reuses them; the basic launcher runs the jobs in this process; other
    launchers' workers are elsewhere. Anything that goes wrong here is left for the multirun to meet and
    report. Returns the warmed processes' pids."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from normbench.sweeps.job import warm_worker

    try:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3", job_name="normbench"):
            cfg = (
                GlobalHydra.instance()
                .config_loader()
                .load_configuration("config", overrides, RunMode.MULTIRUN)
            )
            launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
        target = launcher.pop("_target_", "")
        if target == JOBLIB_LAUNCHER:
            from hydra_plugins.hydra_joblib_launcher._core import process_joblib_cfg
            from joblib import Parallel, delayed, effective_n_jobs

            joblib_cfg = {**launcher, "backend": "loky"}  # as hydra_joblib_launcher._core.launch
            process_joblib_cfg(joblib_cfg)
            workers = effective_n_jobs(joblib_cfg["n_jobs"])
            return Parallel(**joblib_cfg)(delayed(warm_worker)(launcher) for _ in range(workers))
        if target == BASIC_LAUNCHER:
            return [warm_worker(launcher)]
    except Exception:
        pass
    finally:
        GlobalHydra.instance().clear()
    return []


_LAUNCHED = threading.Event()  # the child has been told what to run: its jobs may be training


def _exit_with_parent(parent: int) -> None:
    # kill -9 of the sweep command must not leave jobs training behind it: a re-run would
    # race them for the same run directories. The child leads its own process group,
    # which holds the local workers too (joblib). Before anything was launched, the
    # orderly way (``abandon``'s) is enough.
    while os.getppid() == parent:
        time.sleep(0.5)
    if _LAUNCHED.is_set():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    else:
        os.kill(os.getpid(), signal.SIGTERM)

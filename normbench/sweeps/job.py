"""The Hydra entry point: one job = one run directory.

``hydra_main`` is the single ``@hydra.main`` function behind both ``normbench train``
(a single run) and ``normbench sweep`` (Hydra's multirun: every sweeper and launcher
plugin calls this same function, which is why it lives at module level: joblib and
submitit pickle it). Each job writes its results into Hydra's output directory.
Under torchrun every process runs this function; rank 0 alone writes and reports
(``normbench.cli`` gives the other ranks a throwaway Hydra directory). ``RunGate``, a Hydra
callback, answers a single run that will not train (a config error, a result already there,
another config's run) before Hydra creates or touches its directory.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape

from normbench.core import provenance
from normbench.core.configtree import conf_dir
from normbench.core.errors import ConfigError, DiskFull
from normbench.core.identity import config_hash
from normbench.core.runs import CONFIG, ERROR_LOG, PLAN, RETRY_ENV, Decision, RunDir, RunLock, write_index
from normbench.model import extensions
from normbench.training.display import summary_table

# PyTorch (normbench.training.loop and what it needs) is imported when a job runs, not with this module:
# the sweep command starts Hydra's multirun in a child process before anything else
# (normbench.sweeps.multirun).

# Installed packages' norms and placements, as config options in every process that composes or
# builds a job: the sweep's child and the launcher's workers import this module (normbench.model.extensions).
extensions.install()


def run_job(cfg: DictConfig, run_dir: str, multirun: bool) -> dict | None:
    """Validate, train and report one configuration into ``run_dir``.

    In a sweep (``multirun``) a job reuses the result its directory already holds for the
    same config (see ``RunDir.decide``), and a failure of any kind is recorded in the run
    directory and returned, never raised: one bad run must not stop the others.
    """
    from normbench.training import distributed

    console = Console(stderr=True)
    main = distributed.is_main()
    # Before the lock's file exists: a single run that turns out to be a config error leaves no directory
    # it made.
    new = RunDir(run_dir).holds_nothing()
    lock = RunLock(run_dir)
    if main and (holder := lock.acquire()):
        # Another process trains this very run (a second sweep on the same directory, a SLURM
        # array still running): never two writers in one run directory.
        console.print(f"running elsewhere: {holder}: {run_dir} (skipped)", soft_wrap=True, highlight=False)
        if not multirun:
            _release_ranks(cfg)
            sys.exit(2)
        return None
    try:
        return _run_locked(cfg, RunDir(run_dir), multirun, console, lock, new)
    except DiskFull as err:  # nothing more can be written: one line, and the run stays resumable
        return _fail(console, err.advice(), multirun, code=1)
    finally:
        lock.release()


def _run_locked(
    cfg: DictConfig, run_dir_: RunDir, multirun: bool, console: Console, lock: RunLock, new: bool
) -> dict | None:
    from normbench.training import distributed
    from normbench.training.config import parse_config
    from normbench.training.loop import train
    from normbench.training.preemption import describe, exit_code

    main = distributed.is_main()
    cfg_hash = config_hash(cfg)
    decision = None
    if main:
        decision = run_dir_.decide(
            cfg_hash,
            sweep=multirun,
            retry=os.environ.get(RETRY_ENV) == "1",
            resume=str(cfg.train.get("resume")),
        )
        if settled(decision, run_dir_, console, multirun, cfg):
            return decision.result
        if decision.stale is not None and not multirun:  # a sweep says it once for all its runs
            console.print(
                f"{run_dir_.path}: its result was computed by other code (numerics {decision.stale}, now "
                f"{provenance.NUMERICS}): training it again",
                soft_wrap=True,
                highlight=False,
            )
        lock.claim()
        run_dir_.prepare(decision)
        run_dir_.write_config(cfg)

    def as_sweep_job(run) -> None:
        if multirun:
            # The sweep command draws its own progress; parallel jobs share the cores.
            run.train.progress = False
            run.train.threads = run.train.threads or job_threads(HydraConfig.get().launcher)
            run.sweep = Path(HydraConfig.get().sweep.dir).name  # trackers group a sweep's runs by it

    try:
        run = parse_config(cfg, cfg_hash)
        as_sweep_job(run)
        if run.train.batched:  # with the other seeds of its batched group (normbench sweep --batch-seeds)
            from normbench.sweeps.batching import train_group
            from normbench.sweeps.planning import Plan

            sweep_dir = Path(HydraConfig.get().sweep.dir) if multirun else None
            plan = Plan.read(sweep_dir) if sweep_dir is not None and (sweep_dir / PLAN).is_file() else None
            summary = train_group(run, run_dir_.path, cfg, console, plan, as_sweep_job)
        else:
            summary = train(run, run_dir_.path, console=console)
    except DiskFull:
        raise  # nothing can be written: run_job says so in one line
    except Exception as err:
        return _job_failed(err, run_dir_, cfg_hash, multirun, console, new, decision)
    if summary["status"] == "interrupted":
        # Stopped by a signal (Ctrl-C, SLURM's preemption notice) after saving a checkpoint. Exiting,
        # in a sweep too, keeps the launcher from starting another job; a sweep says in its own line
        # what stopped, so its jobs print nothing here.
        if main and not multirun:
            console.print(
                f"[yellow]interrupted[/yellow] at step {summary['steps']} ({describe(summary['signal'])}), "
                f"{escape(stopped_checkpoint(summary))}: {escape(resume_command(run_dir_.path))}",
                soft_wrap=True,
                highlight=False,
            )
        sys.exit(exit_code(summary["signal"]))
    if main:
        console.print(summary_table(summary, shown_path(run_dir_.path)))
    if summary["status"] == "failed":
        if main:  # the other ranks printed their traceback already
            console.print(
                f"[bold red]run failed:[/bold red] {escape(summary['error'])} (traceback in "
                f"{run_dir_.path / ERROR_LOG})"
            )
        if not multirun:
            sys.exit(1)
    return summary


def stopped_checkpoint(summary: dict) -> str:
    """What a run stopped by a signal left to resume from, and where its resume starts."""
    saved, step = summary.get("saved_step"), summary["steps"]
    if saved == step:
        return "checkpoint saved; resume with"
    failed = f"its checkpoint not written ({summary.get('checkpoint_failure')})"
    if saved is None:
        return f"{failed}, none saved before; start again with"
    return f"{failed}; resume at step {saved} with"


def _job_failed(
    err: Exception,
    run_dir_: RunDir,
    cfg_hash: str,
    multirun: bool,
    console: Console,
    new: bool,
    decision: Decision | None,
) -> None:
    """A job's edge: what a run that failed before its loop ended leaves and says. A user's mistake
    (ConfigError) is one line and exit 2: a sweep job's is recorded as failed (never completed) so the
    sweep's index and report show it, and a single run's is no run, so what this command wrote goes.
    A crash (building the data or the model, say) fails this run only: its traceback goes to
    error.log, the terminal gets one line, exit 1. A sweep's other jobs go on either way."""
    from normbench.training import distributed

    main = distributed.is_main()
    if not isinstance(err, ConfigError):
        if main:
            run_dir_.write_failure(f"{type(err).__name__}: {err}", traceback.format_exc(), cfg_hash)
        return _fail(
            console,
            f"{type(err).__name__}: {escape(str(err))} (traceback in {run_dir_.path / ERROR_LOG})",
            multirun,
            code=1,
            label="run failed",
        )
    if main and multirun:
        run_dir_.write_failure(f"config error: {err}", f"config error: {err}\n", cfg_hash)
    elif main and new:
        shutil.rmtree(run_dir_.path, ignore_errors=True)
    elif main and decision.action == "fresh":
        (run_dir_.path / CONFIG).unlink(missing_ok=True)
    # Every rank says so: an error only one rank hits (its GPU, say) must not go unseen.
    rank = "" if main else f"(rank {distributed.rank()}) "
    return _fail(console, f"{rank}{escape(str(err))}", multirun, code=2)


def settled(decision: Decision, run_dir: RunDir, console: Console, multirun: bool, cfg: DictConfig) -> bool:
    """Whether ``decision`` settles the job without training: a result reused (said so), or a refusal (one
    line; a single run exits 2). Either way nothing in the run directory has changed, and under
    torchrun the other ranks end with this one."""
    if decision.action in ("reuse", "refuse") and not multirun:
        _release_ranks(cfg)
    if decision.action == "reuse":
        again = "" if multirun else "; train.resume=never trains it again"
        console.print(
            f"already {decision.result.get('status')} with this config: {shown_path(run_dir.path)} "
            f"(skipped{again})",
            soft_wrap=True,
            highlight=False,
        )
        return True
    if decision.action == "refuse":
        _fail(console, decision.reason, multirun, code=2)
        return True
    return False


class RunGate(Callback):
    """``normbench train``'s checks before Hydra creates the run directory (conf/config.yaml's
    hydra.callbacks): a config error, a result this config already has there, or a run of another config
    there ends the command with nothing written, not even Hydra's .hydra/ (``run_job`` decides again
    under the run's lock)."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from normbench.training import distributed
        from normbench.training.config import checked

        console = Console(stderr=True)
        cfg_hash = config_hash(config)
        # Hydra turns a callback's exception into a warning and goes on to create the run directory,
        # so the gate ends the command itself.
        if (why := checked(config, cfg_hash)[1]) is not None:
            _fail(console, escape(why), multirun=False, code=2)
        if not distributed.is_main():  # the other ranks' Hydra directory is a scratch one (normbench.cli)
            return
        HydraConfig.instance().set_config(config)  # what hydra.run.dir may interpolate (${hydra:...})
        run_dir = RunDir(config.hydra.run.dir)
        decision = run_dir.decide(cfg_hash, resume=str(config.train.get("resume")))
        if settled(decision, run_dir, console, False, config):
            sys.exit(0)


def _release_ranks(cfg: DictConfig) -> None:
    """Under torchrun, rank 0 that will not train tells the other ranks so (they end with it)."""
    from normbench.core.devices import resolve_device
    from normbench.training import distributed

    if distributed.launched():
        distributed.release(resolve_device(cfg.train.device))


def shown_path(path: Path) -> Path:
    """A path as a person reads it: relative to the working directory when inside it."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:  # outside the working directory
        return path.resolve()


def resume_command(run_dir: Path) -> str:
    """The command that resumes this single run: the same overrides, in the same run directory
    (the default one is named after the time it started, so the command alone would start afresh)."""
    from normbench.training import distributed

    where = f"hydra.run.dir={shown_path(run_dir)}"
    # torchrun's own arguments are not Hydra's to know; run_job called directly has no command line
    if distributed.launched() or not HydraConfig.initialized():
        return f"the same command with {where}"
    overrides = HydraConfig.get().overrides
    given = [o for o in overrides.hydra if not o.startswith("hydra.mode=")]  # Hydra adds hydra.mode
    if not any(o.startswith("hydra.run.dir=") for o in given):
        given.append(where)
    return shlex.join(["normbench", "train", *overrides.task, *given])


def _fail(console: Console, message: str, multirun: bool, code: int, label: str = "error") -> None:
    """One line on the terminal; a single run exits with ``code``, a sweep job returns (the others go on)."""
    console.print(f"[bold red]{label}:[/bold red] {message}", soft_wrap=True, highlight=False)
    if not multirun:
        sys.exit(code)
    return None


def job_threads(launcher: DictConfig | dict | None) -> int:
    """Torch threads for one job, so parallel jobs don't oversubscribe the cores; 0 = torch's default.

    The local and joblib launchers run n_jobs jobs at once on this machine: each gets cpus // n_jobs threads
    (n_jobs=-1 means one job per cpu, -2 all but one, as in joblib). submitit jobs get
    their cpus_per_task, Ray tasks their ray.remote.num_cpus. The basic launcher runs one
    job at a time: torch's default. An explicit train.threads always wins (the caller
    checks that).
    """
    from normbench.core.devices import available_cpus, local_parallel_jobs

    launcher = launcher or {}
    if launcher.get("n_jobs"):
        return max(1, available_cpus() // local_parallel_jobs(launcher))
    ray_cpus = ((launcher.get("ray") or {}).get("remote") or {}).get("num_cpus")
    per_task = launcher.get("cpus_per_task") or ray_cpus
    return int(per_task) if per_task else 0


def warm_worker(launcher: dict) -> None:
    """Run once in each of the local launcher's workers before its first job (they start while the
    sweeper plans, normbench.sweeps.launching): the imports and what a process's first run pays once."""
    from normbench.training.loop import warm_up

    warm_up(job_threads(launcher))


def task(cfg: DictConfig) -> None:
    """One job, as Hydra calls it: a run, or one run of a sweep."""
    from normbench.training import distributed, preemption

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    if multirun and distributed.launched():
        Console(stderr=True).print(
            "[bold red]error:[/bold red] torchrun runs one data-parallel training job, not a sweep (-m): "
            "sweep with a launcher (one job per GPU, e.g. hydra/launcher=submitit_slurm) or start torchrun "
            "once per configuration; see 'Scaling out' (docs/scaling-out.md)"
        )
        sys.exit(2)
    if multirun and preemption.noted():  # Ctrl-C reached this worker before its job began: it does not begin
        sys.exit(preemption.exit_code(preemption.noted()))
    try:
        with preemption.noting_ctrl_c():
            run_job(cfg, hc.runtime.output_dir, multirun=multirun)
    except BaseException as err:
        code = err.code if isinstance(err, SystemExit) else 1
        # A failure under torchrun (an exit with 1 or 2, or an exception): this rank's peers may wait
        # in a collective it will never join, so it ends at once and torchrun stops the others. A
        # stop every rank agreed on (a signal: 128 + its number) leaves the group in order below.
        if distributed.world_size() > 1 and code and (not isinstance(code, int) or code < 128):
            if not isinstance(err, SystemExit):
                traceback.print_exc()
            distributed.abandon(code if isinstance(code, int) else 1)
        raise
    finally:
        distributed.teardown()
        if multirun:
            write_index(Path(hc.sweep.dir))


# A plain module-level ``task`` under the decorated entry point: launchers pickle the task function
# by reference (normbench's local launcher with the standard pickle, which needs the very object).
hydra_main = hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")(task)

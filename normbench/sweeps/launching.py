"""The local launcher's worker processes (``hydra/launcher=local``): started, warmed, fed jobs, stopped.

``WarmPool`` owns a ``concurrent.futures.ProcessPoolExecutor`` of ``n_jobs`` processes. They start
at once (the launcher is set up before the sweeper plans) and each warms up in its initializer:
Hydra's resolvers, then ``normbench.sweeps.job.warm_worker`` (PyTorch's imports, what a process's
first run pays once). The jobs go to them composed (``normbench.sweeps.composing``, in the
launching process, where the plan composed every choice of groups already): a worker composes
nothing and scans no plugins; it runs each job through Hydra's public ``run_job``.

At most ``n_jobs`` jobs are in flight: when one returns, the next is submitted. So a stop starts
no new job: Ctrl-C or SIGTERM (to the sweep's process group, where the jobs get it too) and a job
that exits on a stop signal (it saved a checkpoint) let the running jobs finish their stop, then
the launcher raises the same stop. A job already submitted but not yet begun (queued while a worker
warms up) is refused by the worker that takes it, once a stop has ended a job there (``_execute``).
When the last job has returned the workers are let go, and each exits without tearing PyTorch down
(most of a second each).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from normbench.core.devices import local_parallel_jobs
from normbench.sweeps import composing
from normbench.sweeps.multirun import STOP_SIGNALS

log = logging.getLogger(__name__)
_worker: dict = {}  # in a worker: the Hydra context and task function every job runs with


class WarmPool:
    def __init__(
        self, n_jobs: int, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ):
        self.hydra_context = hydra_context
        self.workers = local_parallel_jobs({"n_jobs": n_jobs}) or 1
        launcher = OmegaConf.to_container(config.hydra.launcher, resolve=True)
        # spawn, not fork: the launching process runs threads (Hydra's, the sweep's watch of its parent).
        self.executor = ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(hydra_context, task_function, launcher),
        )
        # One task per worker starts every worker now (the executor starts them as tasks arrive), each
        # with Ctrl-C held back until its initializer notes it: one that comes while a worker imports
        # waits for it instead of being lost there (normbench.training.preemption).
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for _ in range(self.workers):
                self.executor.submit(os.getpid)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def run(
        self, master: DictConfig, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> list[JobReturn]:
        """Run the jobs, ``self.workers`` at a time; their JobReturns in order."""
        setup_globals()
        configure_log(master.hydra.hydra_logging, master.hydra.verbose)
        Path(str(master.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info(f"Launching {len(job_overrides)} jobs on {self.workers} local worker(s)")
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
        todo = iter(enumerate(job_overrides, start=initial_job_idx))
        running: dict[Future, int] = {}  # the jobs in flight, and their numbers
        returns: dict[int, JobReturn] = {}
        stop: BaseException | None = None

        def submit_next() -> None:
            idx, overrides = next(todo, (None, None))
            if overrides is None or stop is not None:
                return
            cfg = composing.compose(self.hydra_context.config_loader, master, list(overrides))
            with open_dict(cfg):
                cfg.hydra.job.id, cfg.hydra.job.num = f"{cfg.hydra.job.name}_{idx}", idx
            running[self.executor.submit(_execute, cfg)] = idx

        def stopped(signum, frame) -> None:  # Ctrl-C or SIGTERM reached the group: no new job
            nonlocal stop
            stop = stop or SystemExit(128 + signum)

        # Noted, never raised: a KeyboardInterrupt here could land inside the executor's own locking
        # (its futures' conditions, the wait's event) and leave the jobs' results undeliverable.
        ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # a process started ignoring Ctrl-C
        stops = STOP_SIGNALS if ignored else (*STOP_SIGNALS, signal.SIGINT)
        previous = {}
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            previous = {sig: signal.signal(sig, stopped) for sig in stops}
        try:
            for _ in range(self.workers):
                submit_next()
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    idx = running.pop(future)
                    try:
                        returns[idx] = future.result()
                    except BaseException as err:  # a job stopped by a signal (at a checkpoint); a lost worker
                        stop = stop or err
                    submit_next()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if stop is not None:
            raise stop
        return [returns[idx] for idx in sorted(returns)]

    def close(self) -> None:
        """Stop the workers once their jobs have returned (or stopped): no job is started after this."""
        self.executor.shutdown(wait=True, cancel_futures=True)


def _init_worker(hydra_context: HydraContext, task_function: TaskFunction, launcher: dict) -> None:
    from normbench.sweeps.job import warm_worker
    from normbench.training import preemption

    preemption.note_ctrl_c()  # for the worker's life: a Ctrl-C before or between jobs stops its next one
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # one held back since the start is noted now
    setup_globals()  # Hydra's resolvers (${now:...}, ${hydra:...})
    atexit.register(_exit_at_once)
    _worker.update(hydra_context=hydra_context, task_function=task_function)
    warm_worker(launcher)


def _exit_at_once() -> None:
    """A worker's end, once the executor lets it go (every result is sent by then: the executor's result
    queue writes synchronously): its output flushed, then no teardown of PyTorch's modules, most of a
    second per worker at the end of every sweep."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _execute(cfg: DictConfig) -> JobReturn:
    """One job in a worker. A job of a sweep exits only when a stop signal ended it (its failures are
    returned); the worker remembers that exit and begins no job after it. The executor queues a job ahead
    of the worker that takes it, so a worker that answered Ctrl-C in one job can find the next already
    queued (its own, or one a worker still warming up would have stopped): it ends with the same code, and
    its run directory is never made."""
    if "stopped" in _worker:
        raise SystemExit(_worker["stopped"])
    HydraConfig.instance().set_config(cfg)
    try:
        return run_job(
            hydra_context=_worker["hydra_context"],
            config=cfg,
            task_function=_worker["task_function"],
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
    except SystemExit as stop:
        _worker["stopped"] = stop.code
        raise

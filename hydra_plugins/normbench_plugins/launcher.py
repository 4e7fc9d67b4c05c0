"""``hydra/launcher=local``: runs a sweep's jobs on ``n_jobs`` warm worker processes of its own.

The workers start when the launcher is set up, before the sweeper plans, and warm up meanwhile
(imports, what a process's first run pays once); each job arrives composed (Hydra composes nothing
in the worker) and runs through Hydra's ``run_job``, as under any launcher. The launcher keeps
``n_jobs`` jobs in flight, no more, so that a stop (Ctrl-C, SIGTERM) starts no new job. The work is in
``normbench.sweeps.launching``.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class LocalLauncherConf:
    _target_: str = "hydra_plugins.normbench_plugins.launcher.LocalLauncher"
    # Jobs at once on this machine, each with cpus // n_jobs torch threads; -1 one per CPU, -2 all but one.
    n_jobs: int = 1


ConfigStore.instance().store(
    group="hydra/launcher", name="local", node=LocalLauncherConf, provider="normbench"
)


class LocalLauncher(Launcher):
    def __init__(self, n_jobs: int = 1) -> None:
        self.n_jobs = n_jobs
        self.pool = None
        self.config: DictConfig | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from normbench.sweeps.launching import WarmPool

        self.config = config
        self.pool = WarmPool(self.n_jobs, hydra_context, task_function, config)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        return self.pool.run(self.config, job_overrides, initial_job_idx)

    def close(self) -> None:
        """Stop the workers (the sweeper calls it once it has launched everything, or nothing)."""
        if self.pool is not None:
            self.pool.close()

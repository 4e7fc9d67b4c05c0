"""``hydra/sweeper=normbench``: plans the grid, skips what is done, launches the rest.

Before launching, ``normbench.sweeps.planning.make_plan`` composes every job (once per choice of
config groups), fixes the stable sweep directory and reads what each run directory holds; the
plan goes to ``plan.json`` and a message on stdout (``normbench.sweeps.multirun.tell``) tells the sweep
command where.
Only the runs with something to do are launched: new ones, interrupted ones, and with
``retry_failed`` the diverged and failed ones. A run locked by another process is left to it.
"""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf


@dataclass
class NormbenchSweeperConf:
    _target_: str = "hydra_plugins.normbench_plugins.sweeper.NormbenchSweeper"
    params: dict[str, str] | None = None  # the grid, as Hydra's basic sweeper reads it (experiments set it)
    retry_failed: bool = False  # launch the diverged and failed runs again (normbench sweep --retry-failed)
    batch_seeds: bool = False  # each config's seeds as one batched model (normbench sweep --batch-seeds)


ConfigStore.instance().store(
    group="hydra/sweeper", name="normbench", node=NormbenchSweeperConf, provider="normbench"
)


class NormbenchSweeper(Sweeper):
    def __init__(
        self, params: dict[str, str] | None = None, retry_failed: bool = False, batch_seeds: bool = False
    ) -> None:
        self.params = params or {}
        self.retry_failed = retry_failed
        self.batch_seeds = batch_seeds  # read by the plan (normbench.sweeps.planning.batches_seeds)
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None
        self.launcher = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from normbench.sweeps.planning import pin_sweep_dir

        self.hydra_context, self.config = hydra_context, config
        # Before the launcher reads the config (submitit's folder is ${hydra.sweep.dir}/.submitit).
        self.sweep_dir = pin_sweep_dir(config)
        # The launcher is set up before the plan: the local one warms its workers while this plans.
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        from normbench.sweeps.batching import launched
        from normbench.sweeps.multirun import tell
        from normbench.sweeps.planning import make_plan, names_runs_by_job, will_run
        from normbench.sweeps.sweep import ray_preflight

        try:
            params = [f"{k}={v}" for k, v in self.params.items()]
            plan = make_plan(
                self.hydra_context.config_loader, self.config, [*params, *arguments], self.sweep_dir
            )
            ray_preflight(plan.launcher)
            plan.write()
            OmegaConf.save(self.config, plan.sweep_dir / "multirun.yaml")
            tell(planned=str(plan.sweep_dir))
            todo = [job for job in plan.jobs if will_run(job, self.retry_failed)]
            if names_runs_by_job(self.config):
                todo = plan.jobs  # run directories named by job number: every job keeps its number
            todo = launched(todo)  # a batched group's leader trains its other seeds
            returns = self.launcher.launch([job.overrides for job in todo], initial_job_idx=0) if todo else []
        finally:
            close = getattr(self.launcher, "close", None)
            if close is not None:
                close()
        for r in returns:
            _ = r.return_value  # a job that raised fails the sweep, as with Hydra's basic sweeper
        return [returns]

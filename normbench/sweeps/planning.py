"""A sweep's plan: the grid's jobs, each with its run directory, config hash and state before launch.

normbench's Hydra sweeper (``hydra/sweeper=normbench``, hydra_plugins/normbench_plugins) plans with
``make_plan`` before it launches anything: the grid (lists, range(), glob(), the experiment's
hydra.sweeper.params), one stable sweep directory (``results/sweeps/NAME-HASH``), one run
directory per distinct config (conf/config.yaml names it after the config hash), and what each
holds already (a result to keep, a checkpoint to resume, a lock held by another process). It
writes the plan to ``plan.json``, which the sweep command reads to draw its live view.
``plan_sweep`` makes the same plan in this process, for ``normbench sweep --dry-run`` and tests.

What a job does with its run directory (reuse a result, resume an interrupted run) is
``normbench.core.runs.RunDir.decide``: the sweeper reads the same decision to skip finished runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hydra.core.config_loader import ConfigLoader
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from normbench.core.configtree import conf_dir, group_options
from normbench.core.errors import ConfigError, composition_error, installed, unknown_option
from normbench.core.fileio import write_atomic
from normbench.core.identity import NOT_HASHED, config_hash
from normbench.core.runs import CONFIG, PLAN, SUMMARY, RunDir, RunLock
from normbench.sweeps import batching, composing

SWEEPER = "hydra_plugins.normbench_plugins.sweeper.NormbenchSweeper"
# Launcher choices that need a plugin, and the extra that installs it.
LAUNCHER_EXTRAS = {
    "joblib": ("hydra_joblib_launcher", "joblib"),
    "submitit_local": ("hydra_submitit_launcher", "slurm"),
    "submitit_slurm": ("hydra_submitit_launcher", "slurm"),
    "slurm": ("hydra_submitit_launcher", "slurm"),
    "ray": ("hydra_ray_launcher", "ray"),
    "ray_aws": ("hydra_ray_launcher", "ray"),
    "ray_cluster": ("hydra_ray_launcher", "ray"),
}


@dataclass
class Job:
    num: int
    overrides: list[str]  # as the sweeper hands them to the launcher
    run_dir: Path
    config_hash: str
    state: str = "new"  # before launch: new, interrupted, completed, diverged, failed, running elsewhere
    invalid: str | None = None  # the ConfigError the job will fail with
    resume_step: int | None = None  # an interrupted run's checkpoint: where it resumes
    holder: str | None = None  # running elsewhere: the process that owns its run directory
    stale: int | None = None  # the numerics of a result stored here by other code: trained again
    # --batch-seeds (normbench.sweeps.batching): the job numbers of its batched group, the leader first,
    # or why its config trains one run at a time
    batch: list[int] | None = None
    unbatched: str | None = None


@dataclass
class Plan:
    sweep_dir: Path
    jobs: list[Job]
    varying: list[str]  # the keys whose value differs between jobs
    launcher: dict | None = None  # hydra.launcher, resolved
    # Each run directory's (config.yaml, summary.json) mtimes before launch: this sweep's work is told
    # from earlier results by a change of file, not by clock (a cluster's file server keeps its own time).
    at_launch: dict[Path, tuple[float, float]] = field(default_factory=dict)

    def values(self, job: Job) -> list[str]:
        kv = dict(o.split("=", 1) for o in job.overrides if "=" in o)
        return [kv.get(key, "") for key in self.varying]

    def write(self) -> None:
        """plan.json in the sweep directory, with what each run directory holds now."""
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        self.at_launch = {
            j.run_dir: (mtime(j.run_dir / CONFIG), mtime(j.run_dir / SUMMARY)) for j in self.jobs
        }
        jobs = [
            {**asdict(j), "job": j.num, "run_dir": j.run_dir.name, "at_launch": self.at_launch[j.run_dir]}
            for j in self.jobs
        ]
        for j in jobs:
            del j["num"]
        body = {"varying": self.varying, "launcher": self.launcher, "jobs": jobs}
        write_atomic(self.sweep_dir / PLAN, json.dumps(body, indent=1) + "\n")

    @classmethod
    def read(cls, sweep_dir: Path) -> Plan:
        body = json.loads((sweep_dir / PLAN).read_text())
        jobs, at_launch = [], {}
        for j in body["jobs"]:
            run_dir = sweep_dir / j["run_dir"]
            at_launch[run_dir] = tuple(j["at_launch"])
            fields = {k: v for k, v in j.items() if k not in ("job", "run_dir", "at_launch")}
            jobs.append(Job(num=j["job"], run_dir=run_dir, **fields))
        return cls(sweep_dir, jobs, body["varying"], body["launcher"], at_launch)


def batches_seeds(master: DictConfig) -> bool:
    """Whether the sweep trains its seeds as batched groups (normbench sweep --batch-seeds)."""
    return bool(master.hydra.sweeper.get("batch_seeds"))


def will_run(job: Job, retry_failed: bool) -> bool:
    return job.state in ("new", "interrupted") or (retry_failed and job.state in ("diverged", "failed"))


def hydra_quote(value: str) -> str:
    """An override value Hydra's parser reads back unchanged."""
    if re.fullmatch(r"[\w./:-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def check_args(args: list[str]) -> None:
    """Mistakes worth a better message than Hydra's, found before anything is composed."""
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except OverrideParseException as err:
        raise ConfigError(
            f"cannot read the override '{err.override}': {err.message.splitlines()[0]}",
            allowed=["KEY=VALUE", "KEY=A,B,C", "KEY=range(START,STOP)", "GROUP=glob(PATTERN)"],
        ) from None
    for o in parsed:
        key = o.key_or_group
        if key == "experiment":
            names = group_options("experiment")
            if o.is_sweep_override():
                raise ConfigError("one experiment per sweep (experiment=NAME)", allowed=names)
            if o.value() not in names:
                raise ConfigError(unknown_option("experiment", o.value(), names))
        if key == "hydra/sweeper" and o.value() != "normbench":
            raise ConfigError(
                "normbench sweep plans, resumes and skips runs with its own sweeper",
                allowed=["hydra/sweeper=normbench"],
            )
        if key == "hydra/launcher":
            name = str(o.value())
            module, extra = LAUNCHER_EXTRAS.get(name, (None, None))
            if module and not installed(f"hydra_plugins.{module}"):
                raise ConfigError(
                    f"hydra/launcher={name} needs the Hydra launcher plugin {module.replace('_', '-')}: "
                    f"pip install 'normbench[{extra}]'"
                )


def default_sweep_dir(cfg: DictConfig, arguments: list[str]) -> Path:
    """results/sweeps/<experiment or grid>-<hash of the user's overrides>: the same command finds the same
    directory.

    The hash ignores the order of the overrides, the launcher and other hydra.* settings,
    and the keys that never change a result (NOT_HASHED).
    """
    keyed = sorted(
        o.input_line
        for o in OverridesParser.create().parse_overrides(arguments)
        if not o.is_hydra_override()
        and not any(o.key_or_group == k or o.key_or_group.startswith(f"{k}.") for k in NOT_HASHED)
    )
    digest = hashlib.sha256("\n".join(keyed).encode()).hexdigest()[:8]
    name = cfg.hydra.runtime.choices.get("experiment") or "grid"
    return Path(str(cfg.results_dir)) / "sweeps" / f"{name}-{digest}"


def grid(overrides) -> list[list[str]]:
    """Every combination of the swept values, the first key varying slowest (as Hydra's basic sweeper)."""
    axes: dict[str, list[str]] = {}
    for o in overrides:
        key = o.get_key_element()
        if not o.is_sweep_override():
            axes[key] = [f"{key}={o.get_value_element_as_str()}"]
        elif o.is_discrete_sweep():
            axes[key] = [f"{key}={value}" for value in o.sweep_string_iterator()]
        else:
            raise ConfigError(
                f"cannot sweep {key} over an interval in a grid", allowed=["KEY=A,B,C", "range(...)"]
            )
    return [list(combination) for combination in itertools.product(*axes.values())]


def names_runs_by_job(master: DictConfig) -> bool:
    """Whether hydra.sweep.subdir reads the job's Hydra config (${hydra:job.num}, say), not its config."""
    return "${hydra:" in str(OmegaConf.to_container(master.hydra.sweep)["subdir"])


def pin_sweep_dir(master: DictConfig) -> Path:
    """The sweep directory (as the user gave it, else ``default_sweep_dir``), then fixed in the master
    config and in the overrides every job is composed from: absolute, because a launcher may run a
    job in another working directory, and resolved once, because ${now:...} would differ in every
    process."""
    as_written = OmegaConf.to_container(master.hydra.overrides.hydra)  # ${hydra:...} unresolved
    given = {o.split("=", 1)[0].lstrip("+") for o in as_written}
    if "hydra.sweep.dir" in given:
        sweep_dir = Path(str(master.hydra.sweep.dir))
    else:
        task = OmegaConf.to_container(master.hydra.overrides.task)
        # batched seeds are other configs (train.batched is hashed): a sweep directory of their own
        sweep_dir = default_sweep_dir(master, [*task, *([batching.MARK] if batches_seeds(master) else [])])
    pinned = str(sweep_dir.resolve())
    with read_write(master), open_dict(master):
        master.hydra.sweep.dir = pinned
        master.hydra.overrides.hydra.append(f"hydra.sweep.dir={hydra_quote(pinned)}")
    return sweep_dir


def make_plan(loader: ConfigLoader, master: DictConfig, overrides: list[str], sweep_dir: Path) -> Plan:
    """The jobs of the grid, each composed as its launcher will compose it, with its run directory and state.

    ``master``: the multirun's config, its sweep directory pinned (``pin_sweep_dir``, which gave
    ``sweep_dir``); ``overrides``: the sweeper's params (an experiment's grid), then the task
    overrides from the command line.
    """
    from normbench.training.config import checked

    if master.hydra.sweeper.get("_target_") != SWEEPER:
        raise ConfigError("normbench sweep plans with its own sweeper", allowed=["hydra/sweeper=normbench"])
    batch_seeds = batches_seeds(master)
    try:
        parsed = OverridesParser.create(config_loader=loader).parse_overrides(overrides)
        needs_hydra_resolver = names_runs_by_job(master)
        jobs, batched, unbatched = [], set(), None
        for num, job_overrides in enumerate(grid(parsed)):
            job_cfg = composing.compose(loader, master, job_overrides)
            if batch_seeds and needs_hydra_resolver:
                unbatched = "hydra.sweep.subdir names runs by job number"
            elif batch_seeds:
                marked, unbatched = batching.mark(job_cfg, job_overrides)
                if marked != job_overrides:
                    job_overrides, job_cfg = marked, composing.compose(loader, master, marked)
            if job_cfg.train.get("batched"):
                batched.add(num)
            with open_dict(job_cfg.hydra.job):
                job_cfg.hydra.job.num, job_cfg.hydra.job.id = num, f"plan_{num}"
            if needs_hydra_resolver:  # ${hydra:job.num} and the like read the job's HydraConfig
                HydraConfig.instance().set_config(job_cfg)
            run_dir = sweep_dir / str(OmegaConf.select(job_cfg, "hydra.sweep.subdir"))
            job = Job(num, job_overrides, run_dir, config_hash(job_cfg), unbatched=unbatched)
            with open_dict(job_cfg):
                del job_cfg["hydra"]
            _, job.invalid = checked(job_cfg, job.config_hash)  # an invalid job is a line of the plan
            jobs.append(job)
        launcher = OmegaConf.to_container(master.hydra.launcher, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(composition_error(err)) from None
    if jobs and all(job.invalid for job in jobs):
        raise ConfigError(jobs[0].invalid)  # nothing would train: say why now rather than after launching
    first: dict[Path, Job] = {}
    for job in jobs:  # e.g. train.lr=1e-3,0.001: two jobs would train into one directory at once
        other = first.setdefault(job.run_dir, job)
        if other is not job:
            raise ConfigError(
                f"jobs {other.num} and {job.num} are the same config "
                f"({' '.join(other.overrides)} / {' '.join(job.overrides)}): drop one of the values"
            )
    for job in jobs:
        job.state = _state_before(job)
        if job.state == "interrupted":
            job.resume_step = RunDir(job.run_dir).checkpoint_step()
    retry = bool(master.hydra.sweeper.get("retry_failed"))
    batching.group(jobs, batched, lambda job: will_run(job, retry))
    keys = [o.split("=", 1)[0] for o in jobs[0].overrides] if jobs else []
    varying = [k for k in keys if len({dict(o.split("=", 1) for o in j.overrides).get(k) for j in jobs}) > 1]
    return Plan(sweep_dir, jobs, varying, launcher)


@contextmanager
def multirun(args: list[str]) -> Iterator[tuple[ConfigLoader, DictConfig, list[str]]]:
    """Hydra's multirun config for these command-line overrides, composed in this process as the
    sweeper receives it: (the loader, the master config, the sweep's overrides: the experiment's
    hydra.sweeper.params, then the task overrides)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    check_args(args)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3", job_name="normbench"):
            loader = GlobalHydra.instance().config_loader()
            try:  # as Hydra's --multirun loads it
                master = loader.load_configuration("config", [*args, "hydra.mode=MULTIRUN"], RunMode.MULTIRUN)
            except (HydraException, OmegaConfBaseException) as err:
                raise ConfigError(composition_error(err)) from None
            params = [f"{k}={v}" for k, v in (master.hydra.sweeper.params or {}).items()]
            task = OmegaConf.to_container(master.hydra.overrides.task)
            yield loader, master, [*params, *task]
    finally:
        GlobalHydra.instance().clear()


def plan_sweep(args: list[str]) -> Plan:
    """``make_plan`` for these command-line overrides, in this process: what the sweeper will plan."""
    with multirun(args) as (loader, master, overrides):
        return make_plan(loader, master, overrides, pin_sweep_dir(master))


def job_configs(args: list[str]) -> list[tuple[list[str], DictConfig]]:
    """Every job of the grid these overrides sweep, with its config composed as the sweeper composes
    it (its hydra node kept: hydra.runtime.choices names the options chosen); nothing is run, and no
    run directory is read."""
    with multirun(args) as (loader, master, overrides):
        try:
            parsed = OverridesParser.create(config_loader=loader).parse_overrides(overrides)
            return [(job, composing.compose(loader, master, job)) for job in grid(parsed)]
        except (HydraException, OmegaConfBaseException) as err:
            raise ConfigError(composition_error(err)) from None


def _state_before(job: Job) -> str:
    """What the job's directory holds before launch, as ``RunDir.decide`` reads it for a sweep job."""
    if holder := RunLock(job.run_dir).holder():
        job.holder = holder
        return "running elsewhere"
    decision = RunDir(job.run_dir).decide(job.config_hash, sweep=True)
    job.stale = decision.stale
    if decision.result is not None:
        return decision.result.get("status", "failed")
    return "interrupted" if decision.action == "resume" else "new"


def mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0

"""Sweeps: ``normbench sweep`` is Hydra's multirun, made resumable and watchable.

Hydra sweeps and launches (the basic sweeper's grid syntax; the basic, joblib, submitit
and ray launchers) and every job runs ``normbench.sweeps.job.hydra_main`` exactly like a
``train`` run. This module adds what a plain multirun lacks:

- a stable sweep directory (``results/sweeps/NAME-HASH``) and one run directory per
  distinct config (``conf/config.yaml`` names it after the config hash), so running the
  same command again resumes it;
- the plan (the jobs the sweeper will make, which ``--dry-run`` lists), the live progress
  and the closing table.

What a job does with its run directory (reuse a result, resume an interrupted run) is
``normbench.core.runs.RunDir.decide``, and the index it rebuilds is ``normbench.core.runs.write_index``:
the jobs never import this module.

``run_sweep`` runs Hydra's multirun in a child process (``normbench.sweeps.multirun``: started
before the plan, its output goes to ``sweep.log``) and watches the run directories, so the
display is the same whatever launcher runs the jobs and wherever they run, as long as they
write to this filesystem.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from normbench.core.devices import available_cpus, local_parallel_jobs
from normbench.core.errors import ConfigError, first_line, installed
from normbench.core.fileio import write_atomic
from normbench.core.runs import (
    CONFIG,
    ERROR_LOG,
    INDEX,
    PLAN,
    RETRY_ENV,
    SUMMARY,
    RunDir,
    RunLock,
    describe_owner,
    run_status,
    write_index,
)
from normbench.sweeps import composing, multirun
from normbench.sweeps.multirun import sweep_owner
from normbench.training.config import NOT_HASHED, conf_dir, config_hash, group_options
from normbench.training.preemption import SIGNALS, exit_code

LOG = "sweep.log"
FINISHED = ("completed", "diverged", "failed")
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
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
STYLES = {
    "completed": "green",
    "diverged": "yellow",
    "failed": "red",
    "interrupted": "magenta",
    "pending": "dim",
    "running elsewhere": "cyan",
}


# ----------------------------------------------------------------------- the plan (runs in the sweep command)


@dataclass
class Job:
    num: int
    overrides: list[str]  # as the sweeper hands them to the job
    run_dir: Path
    config_hash: str
    state: str = "new"  # before launch: new, interrupted, completed, diverged, failed
    invalid: str | None = None  # the ConfigError the job will fail with
    resume_step: int | None = None  # an interrupted run's checkpoint: where it resumes
    holder: str | None = None  # running elsewhere: the process that owns its run directory


@dataclass
class Plan:
    sweep_dir: Path
    jobs: list[Job]
    args: list[str]  # the overrides Hydra's multirun gets: the user's plus the sweep dir
    varying: list[str]  # the keys whose value differs between jobs
    launcher: dict | None = None  # hydra.launcher, resolved

    def values(self, job: Job) -> list[str]:
        kv = dict(o.split("=", 1) for o in job.overrides if "=" in o)
        return [kv.get(key, "") for key in self.varying]


def _hydra_quote(value: str) -> str:
    """An override value Hydra's parser reads back unchanged."""
    if re.fullmatch(r"[\w./:-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _check_args(parsed) -> None:
    """Mistakes worth a better message than Hydra's."""
    for o in parsed:
        key = o.key_or_group
        if key == "experiment":
            names = group_options("experiment")
            if o.is_sweep_override():
                raise ConfigError("one experiment per sweep (experiment=NAME)", allowed=names)
            if o.value() not in names:
                raise ConfigError(f"unknown experiment '{o.value()}'", allowed=names)
        if key == "hydra/launcher":
            name = str(o.value())
            module, extra = LAUNCHER_EXTRAS.get(name, (None, None))
            if module and not installed(f"hydra_plugins.{module}"):
                raise ConfigError(
                    f"hydra/launcher={name} needs the Hydra launcher plugin {module.replace('_', '-')}: "
                    f"pip install 'normbench[{extra}]'"
                )


def _short(err: Exception) -> str:
    """Hydra's composition errors on one line, with the options it lists but not its search path."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if len(lines) > 1 and lines[1].startswith("Available options"):
        options = [line for line in lines[2:] if not line.startswith(("Config search path", "provider="))]
        return f"{lines[0]}; {lines[1].rstrip(':').lower()}: {', '.join(options)}"
    return " ".join(lines[:2])


def default_sweep_dir(cfg: DictConfig, parsed: list) -> Path:
    """results/sweeps/<experiment or grid>-<hash of the user's overrides>: the same command finds the same
    directory.

    The hash ignores the order of the overrides, the launcher and other hydra.* settings,
    and the keys that never change a result (NOT_HASHED).
    """
    keyed = sorted(
        o.input_line
        for o in parsed
        if not o.is_hydra_override()
        and not any(o.key_or_group == k or o.key_or_group.startswith(f"{k}.") for k in NOT_HASHED)
    )
    digest = hashlib.sha256("\n".join(keyed).encode()).hexdigest()[:8]
    name = cfg.hydra.runtime.choices.get("experiment") or "grid"
    return Path(str(cfg.results_dir)) / "sweeps" / f"{name}-{digest}"


def plan_sweep(args: list[str]) -> Plan:
    """The jobs Hydra's basic sweeper will make from these overrides, each with its run directory and state.

    Uses the sweeper's own parser and grid expansion (lists, range(), glob(), the
    experiment's hydra.sweeper.params) and composes every job's config as Hydra will.
    """
    from hydra import initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException, OverrideParseException
    from hydra.types import RunMode
    from omegaconf.errors import OmegaConfBaseException

    from normbench.training.config import parse_config

    composing.install()  # every job's config composed as Hydra does, once per choice of groups
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except OverrideParseException as err:
        raise ConfigError(
            f"cannot read the override '{err.override}': {err.message.splitlines()[0]}",
            allowed=["KEY=VALUE", "KEY=A,B,C", "KEY=range(START,STOP)", "GROUP=glob(PATTERN)"],
        ) from None
    _check_args(parsed)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3", job_name="normbench"):
            loader = GlobalHydra.instance().config_loader()
            cfg = loader.load_configuration("config", args, RunMode.MULTIRUN)
            if cfg.hydra.sweeper.get("_target_") != BASIC_SWEEPER:
                raise ConfigError(
                    "normbench sweep plans and resumes grids of Hydra's basic sweeper",
                    allowed=["hydra/sweeper=basic"],
                )
            hydra_overrides = OmegaConf.to_container(
                cfg.hydra.overrides.hydra
            )  # as written: ${hydra:...} unresolved
            if "hydra.sweep.dir" in {o.split("=", 1)[0].lstrip("+") for o in hydra_overrides}:
                sweep_dir = Path(str(cfg.hydra.sweep.dir))
            else:
                sweep_dir = default_sweep_dir(cfg, parsed)
            # Pinned for the jobs: absolute, because a launcher may run them in another working
            # directory, and resolved once, because ${now:...} would differ in every process.
            args = [*args, f"hydra.sweep.dir={_hydra_quote(str(sweep_dir.resolve()))}"]
            # The jobs' master config, as the multirun will load it (``--multirun`` adds hydra.mode):
            # its job processes reuse what the plan composes from it (normbench.sweeps.composing.share).
            cfg = loader.load_configuration("config", [*args, "hydra.mode=MULTIRUN"], RunMode.MULTIRUN)
            launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
            params = [f"{k}={v}" for k, v in (cfg.hydra.sweeper.params or {}).items()]
            overrides = OverridesParser.create(config_loader=loader).parse_overrides(
                params + list(cfg.hydra.overrides.task)
            )
            jobs = []
            needs_hydra_resolver = "${hydra:" in str(OmegaConf.to_container(cfg.hydra.sweep)["subdir"])
            for num, job_overrides in enumerate(BasicSweeper.split_arguments(overrides, None)[0]):
                job_cfg = loader.load_sweep_config(cfg, list(job_overrides))
                with open_dict(job_cfg.hydra.job):
                    job_cfg.hydra.job.num, job_cfg.hydra.job.id = num, f"plan_{num}"
                if needs_hydra_resolver:  # ${hydra:job.num} and the like read the job's HydraConfig
                    HydraConfig.instance().set_config(job_cfg)
                run_dir = sweep_dir / str(OmegaConf.select(job_cfg, "hydra.sweep.subdir"))
                job = Job(num, list(job_overrides), run_dir, config_hash(job_cfg))
                try:
                    with open_dict(job_cfg):
                        del job_cfg["hydra"]
                    parse_config(job_cfg, job.config_hash)
                except ConfigError as err:
                    job.invalid = str(err)
                jobs.append(job)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(_short(err)) from None
    finally:
        GlobalHydra.instance().clear()
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
    keys = [o.split("=", 1)[0] for o in jobs[0].overrides] if jobs else []
    varying = [k for k in keys if len({dict(o.split("=", 1) for o in j.overrides).get(k) for j in jobs}) > 1]
    return Plan(sweep_dir, jobs, args, varying, launcher)


def _state_before(job: Job) -> str:
    """What the job's directory holds before launch, as ``RunDir.decide`` reads it for a sweep job."""
    if holder := RunLock(job.run_dir).holder():
        job.holder = holder
        return "running elsewhere"
    decision = RunDir(job.run_dir).decide(job.config_hash, sweep=True)
    if decision.result is not None:
        return decision.result.get("status", "failed")
    return "interrupted" if decision.action == "resume" else "new"


def will_run(job: Job, retry_failed: bool) -> bool:
    return job.state in ("new", "interrupted") or (retry_failed and job.state in ("diverged", "failed"))


# ----------------------------------------------------------------------------- the sweep command


def _table(title: str, plan: Plan) -> Table:
    """A table with the job number and one column per swept key, which keep their width; the run dir gives
    way."""
    table = Table(title=title, title_justify="left")
    table.add_column("#", justify="right", no_wrap=True)
    names = [key.rsplit(".", 1)[-1] for key in plan.varying]  # train.lr -> lr, unless two keys end alike
    for key, name in zip(plan.varying, names):
        table.add_column(name if names.count(name) == 1 else key, no_wrap=True)
    return table


def _plan_table(plan: Plan, retry_failed: bool) -> Table:
    table = _table(f"{_runs(len(plan.jobs))} in {plan.sweep_dir}", plan)
    table.add_column("run dir", no_wrap=True)
    table.add_column("state")
    for job in plan.jobs:
        action = ("fail" if job.invalid else "run") if will_run(job, retry_failed) else "keep"
        if job.holder:
            action = f"skip ({job.holder})"
        if job.resume_step is not None:
            action = f"resume at step {job.resume_step}"
        state = Text.assemble((job.state, STYLES.get(job.state, "")), f" → {action}")
        if job.invalid:
            state.append(f" (invalid: {job.invalid})", style="red")
        table.add_row(str(job.num), *map(Text, plan.values(job)), job.run_dir.name, state)
    return table


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _counts(states: list[str]) -> str:
    parts = [
        f"{states.count(s)} {s}"
        for s in ("completed", "diverged", "failed", "interrupted", "running elsewhere")
        if states.count(s)
    ]
    return ", ".join(parts) or "none"


def _closing_table(plan: Plan, by_dir: dict[str, dict]) -> Table:
    table = _table(f"sweep {plan.sweep_dir}", plan)
    table.add_column("status", no_wrap=True)
    table.add_column("val loss", justify="right", no_wrap=True)
    table.add_column("wall s", justify="right", no_wrap=True)
    for job in plan.jobs:
        row = by_dir.get(job.run_dir.name, {})
        status = row.get("status", "pending")
        loss, wall = row.get("final_val_loss"), row.get("wall_s")
        at = f" at step {row['resume_step']}" if row.get("resume_step") is not None else ""
        cells = [
            Text(status + at, STYLES.get(status, "")),
            "-" if loss is None else f"{loss:.4f}",
            "-" if wall is None else f"{wall:.1f}",
        ]
        table.add_row(str(job.num), *map(Text, plan.values(job)), *cells)
    return table


# ----------------------------------------------------------------------------- Ray: will a run ever start?


RAY_LAUNCHER = "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"
RAY_REMOTE = "hydra.launcher.ray.remote"


def ray_preflight(launcher: dict | None) -> None:
    """Under hydra/launcher=ray or ray_cluster, refuse (ConfigError) a per-run request that no node of
    the cluster can ever hold: Ray would keep every task pending, and the sweep would wait forever."""
    if not launcher or launcher.get("_target_") != RAY_LAUNCHER:
        return
    ray_cfg = launcher.get("ray") or {}
    remote, address = ray_cfg.get("remote") or {}, (ray_cfg.get("init") or {}).get("address")
    refusal = too_large_for_every_node(remote, ray_nodes(address), address)
    if refusal:
        raise ConfigError(refusal)


def ray_nodes(address: str | None) -> list[dict]:
    """The resources ({"CPU": 2.0, "GPU": 0.0}) of each live node of the cluster at ``address``;
    None: the launcher starts a Ray of its own on this machine, whose resources are this machine's."""
    if address is None:
        import torch

        return [{"CPU": float(available_cpus()), "GPU": float(torch.cuda.device_count())}]
    import ray

    try:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise ConfigError(
            f"hydra/launcher: no Ray cluster at address={address} ({first_line(err)}): start one "
            "(ray start --head) or let the launcher start its own with hydra.launcher.ray.init.address=null"
        ) from None
    try:
        return [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    finally:
        ray.shutdown()


def ray_request(remote: dict) -> dict[str, float]:
    """What one run asks of a Ray node (hydra.launcher.ray.remote), Ray's task defaults filled in."""
    return {"CPU": float(remote.get("num_cpus") or 1), "GPU": float(remote.get("num_gpus") or 0)}


def waiting_for_ray(launcher: dict | None, pending: int) -> str:
    """The live view's note on runs not started under Ray, which submits every job at once: each one
    pending waits for a node with the CPUs and GPUs it asks to come free. Empty for other launchers."""
    if not pending or not launcher or launcher.get("_target_") != RAY_LAUNCHER:
        return ""
    want = ray_request((launcher.get("ray") or {}).get("remote") or {})
    asks = " and ".join(f"{n:g} {key}{'s' if n != 1 else ''}" for key, n in want.items() if n or key == "CPU")
    return f" · {pending} waiting for Ray to free {asks} on a node ({RAY_REMOTE})"


def too_large_for_every_node(remote: dict, nodes: list[dict], address: str | None) -> str | None:
    """The one-line refusal when no node has the CPUs and GPUs one run asks for, else None."""
    want = ray_request(remote)
    if any(all(node.get(key, 0.0) >= n for key, n in want.items()) for node in nodes):
        return None
    largest = max(nodes, key=lambda node: (node.get("GPU", 0.0), node.get("CPU", 0.0)), default={})
    have = {key: int(largest.get(key, 0.0)) for key in want}
    fix = " ".join(
        f"{RAY_REMOTE}.num_{key.lower()}s={min(int(want[key]), have[key])}"
        for key in want
        if want[key] > have[key]
    )

    def count(n: int, what: str) -> str:
        return f"{n} {what}" if n == 1 else f"{n} {what}s"

    where = (
        f"the largest node of the Ray cluster at {address}" if address else "this machine (Ray started here)"
    )
    return (
        f"each run asks Ray for {count(int(want['CPU']), 'CPU')} and {count(int(want['GPU']), 'GPU')}, but "
        f"{where} "
        f"has {count(have['CPU'], 'CPU')} and {count(have['GPU'], 'GPU')}: no run could ever start; set {fix}"
    )


def run_sweep(
    args: list[str],
    dry_run: bool = False,
    retry_failed: bool = False,
    console: Console | None = None,
    poll_s: float = 0.5,
    child: subprocess.Popen | None = None,
) -> int:
    """Plan, then run (or with dry_run only list) the sweep; return the exit code: 1 if any run failed.

    ``child``: the multirun's child, already started for ``args`` (``normbench.sweeps.multirun.start``);
    by default it is started here, before the plan, so that it warms up while this plans."""
    console = console or Console()
    started = time.perf_counter()
    if child is None and not dry_run:
        child = multirun.start(args)
    try:  # until it is launched, the warming child goes with any error
        plan = plan_sweep(args)
        ray_preflight(plan.launcher)
        at_launch = {} if dry_run else _write_plan(plan)
    except BaseException:
        multirun.abandon(child)
        raise
    todo = [j for j in plan.jobs if will_run(j, retry_failed)]
    done = [j.state for j in plan.jobs if not will_run(j, retry_failed)]
    have = (
        f"{len(done)} {'has' if len(done) == 1 else 'have'} results ({_counts(done)})"
        if done
        else "none has results yet"
    )
    redo = [j.state for j in todo if j.state != "new"]
    headline = f"{_runs(len(plan.jobs))} in {plan.sweep_dir}: {have}, {len(todo)} to run" + (
        f" ({_counts(redo)} among them)" if redo else ""
    )
    if dry_run:
        console.print(_plan_table(plan, retry_failed))
        console.print(headline, soft_wrap=True)
        return 0
    if not todo:
        multirun.abandon(child)

    console.print(headline, soft_wrap=True)
    returncode = 0
    if todo:  # with nothing to run, Hydra has nothing to do either
        try:
            returncode = _launch(plan, retry_failed, console, poll_s, at_launch, child)
        except KeyboardInterrupt:
            write_index(plan.sweep_dir, final=True)
            console.print("[yellow]interrupted[/yellow]: run the same command again to resume")
            return 130

    rows = write_index(plan.sweep_dir, final=True)
    by_dir = {r["run_dir"]: r for r in rows}
    console.print(_closing_table(plan, by_dir))
    for job in plan.jobs:
        row = by_dir.get(job.run_dir.name, {})
        if row.get("status") == "failed":
            what = " ".join(plan.values(job)) or job.run_dir.name
            console.print(
                Text.assemble(("failed", "red"), f" {what}: {row.get('error')} ({job.run_dir / ERROR_LOG})")
            )
    states = [r["status"] for r in rows]
    console.print(
        f"{_runs(len(states))}: {_counts(states)}{_efficiency(plan, at_launch, started)}; "
        f"index: {plan.sweep_dir / INDEX}; compare them with: normbench report {plan.sweep_dir}",
        soft_wrap=True,
    )
    _account_for_others(plan, by_dir, at_launch, console)
    if returncode in {exit_code(sig) for sig in SIGNALS}:
        console.print(
            f"[yellow]interrupted[/yellow] by signal {returncode - 128}: run the same command again to "
            "resume (runs cut short continue from their checkpoints)",
            soft_wrap=True,
        )
        return returncode
    if returncode != 0:
        lines = [
            line
            for line in (plan.sweep_dir / LOG).read_text(encoding="utf-8", errors="replace").splitlines()
            if line.strip()
        ]
        console.print(
            Text.assemble(
                ("Hydra's multirun stopped with an error: ", "red"),
                lines[-1] if lines else "",
                f" (the whole traceback is in {plan.sweep_dir / LOG})",
            )
        )
        return 1
    unfinished = [s for s in states if s not in (*FINISHED, "running elsewhere")]
    return 1 if "failed" in states or unfinished else 0


def _write_plan(plan: Plan) -> dict:
    """plan.json in the sweep directory; returns what each run directory holds at launch, to tell this
    sweep's work from earlier results by a change of file, not by clock (a cluster's file server
    keeps its own time)."""
    plan.sweep_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(
        plan.sweep_dir / PLAN,
        json.dumps(
            {
                "args": plan.args,
                "jobs": [
                    {
                        "job": j.num,
                        "overrides": j.overrides,
                        "run_dir": j.run_dir.name,
                        "config_hash": j.config_hash,
                    }
                    for j in plan.jobs
                ],
            },
            indent=1,
        )
        + "\n",
    )
    return {job.run_dir: (_mtime(job.run_dir / CONFIG), _mtime(job.run_dir / SUMMARY)) for job in plan.jobs}


def _efficiency(plan: Plan, at_launch: dict, started: float) -> str:
    """ ", training steps 87% of 2 workers x 183 s": the share of the workers' time this sweep spent
    in the updates of the runs it trained (summary.json's time_s), start-up and waiting included.
    Empty for launchers whose workers are elsewhere, or when this sweep trained nothing."""
    workers = local_parallel_jobs(plan.launcher)
    steps = [
        (RunDir(job.run_dir).read_summary() or {}).get("time_s", {}).get("steps", 0.0)
        for job in plan.jobs
        if _mtime(job.run_dir / SUMMARY) != at_launch[job.run_dir][1]
        and RunLock(job.run_dir).last_owner().get("sweep") == sweep_owner()
    ]
    wall = time.perf_counter() - started
    if not workers or not any(steps):
        return ""
    return (
        f", training steps {100 * sum(steps) / (workers * wall):.0f}% of {workers} "
        f"worker{'s' if workers > 1 else ''} x {wall:.0f} s"
    )


def _account_for_others(plan: Plan, by_dir: dict[str, dict], at_launch: dict, console: Console) -> None:
    """Say which runs another process trained or trains while this sweep ran (a second sweep on the
    same directory, a SLURM array still running): this sweep skipped them."""
    others: dict[str, list[str]] = {}
    for job in plan.jobs:
        status = by_dir.get(job.run_dir.name, {}).get("status")
        lock = RunLock(job.run_dir)
        if status == "running elsewhere":
            others.setdefault(lock.holder() or "another process", []).append(status)
        elif status in FINISHED and _mtime(job.run_dir / SUMMARY) != at_launch[job.run_dir][1]:
            owner = lock.last_owner()
            if owner and owner.get("sweep") != sweep_owner():
                others.setdefault(describe_owner(owner), []).append(status)
    for who, states in others.items():
        console.print(
            f"[cyan]{_runs(len(states))} trained by another process ({who})[/cyan], skipped here: "
            f"{_counts(states).replace('running elsewhere', 'still running')}"
            + (
                "; run the same command again once it is done to see every result"
                if "running elsewhere" in states
                else ""
            ),
            soft_wrap=True,
            highlight=False,
        )


def _launch(
    plan: Plan,
    retry_failed: bool,
    console: Console,
    poll_s: float,
    at_launch: dict,
    child: subprocess.Popen | None,
) -> int:
    """Run Hydra's multirun in the child process (the warmed one, else a new one), its output into
    sweep.log, and watch it; return its exit code."""
    console.print(f"[dim]Hydra's output: {plan.sweep_dir / LOG}[/dim]")
    extra = [f"++hydra.job.env_set.{RETRY_ENV}=1"] if retry_failed else []
    args = ["--multirun", *plan.args, *extra]
    try:
        with open(plan.sweep_dir / LOG, "a", encoding="utf-8") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(args)}\n")
        # Its own process group: Ctrl-C or the death of this process stops every job it started.
        proc = multirun.launch(child, args, composing.shared_bytes())
    except BaseException:
        multirun.abandon(child)
        raise
    output = multirun.copy_output(proc, plan.sweep_dir / LOG)
    previous = _forward_stop_signals(proc)
    try:
        _watch(plan, proc, console, poll_s, at_launch)
    except KeyboardInterrupt:
        multirun.stop(proc)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        output.join(timeout=10)  # the last lines in sweep.log before it is read (or the workers hold it open)
        proc.stdout.close()
    return proc.returncode


def _forward_stop_signals(proc: subprocess.Popen) -> dict:
    """SIGTERM/SIGUSR1 to the sweep command (a preempted SLURM job, say) go on to every job, which
    checkpoints and exits; the watch goes on until they have. Returns the handlers to restore."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def forward(signum, frame):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    return {sig: signal.signal(sig, forward) for sig in SIGNALS}


def _watch(plan: Plan, proc: subprocess.Popen, console: Console, poll_s: float, at_launch: dict) -> None:
    """Draw runs done / running / failed / diverged from the run directories until Hydra's process ends."""
    reported: set[Path] = set()
    # A finished run's state, by its summary's mtime: a summary that has not changed is not read
    # again (this process shares the cores with the jobs it watches).
    finished: dict[Path, tuple[float, str]] = {}
    columns = (
        TextColumn("[bold]sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("sweep", total=len(plan.jobs), counts="")
        while True:
            exited = proc.poll() is not None
            states = []
            for job in plan.jobs:
                config_then, summary_then = at_launch[job.run_dir]
                summary_now = _mtime(job.run_dir / SUMMARY)
                if job.run_dir in finished and finished[job.run_dir][0] == summary_now:
                    states.append(finished[job.run_dir][1])
                    continue
                state = run_status(job.run_dir)
                if state in FINISHED and summary_now:
                    finished[job.run_dir] = (summary_now, state)
                if state == "running" and _mtime(job.run_dir / CONFIG) == config_then:
                    state = "pending"  # left over from a killed sweep, not started again yet
                if state in FINISHED and job.run_dir not in reported and summary_now != summary_then:
                    reported.add(job.run_dir)
                    summary = RunDir(job.run_dir).read_summary() or {}
                    loss = summary.get("final_val_loss")
                    detail = f"val {loss:.4f}" if loss is not None else (summary.get("error") or "")
                    what = " ".join(plan.values(job)) or job.run_dir.name
                    bar.console.print(Text.assemble((f"{state:>9}", STYLES[state]), f" {what}  {detail}"))
                states.append(state)
            counts = (
                f"{states.count('running')} running · [red]{states.count('failed')} failed[/red] · "
                f"[yellow]{states.count('diverged')} diverged[/yellow]"
                + waiting_for_ray(plan.launcher, states.count("pending"))
            )
            bar.update(task, completed=sum(s in FINISHED for s in states), counts=counts)
            if exited:
                return
            try:  # returns as soon as Hydra's process ends: the closing account need not wait a poll
                proc.wait(timeout=poll_s)
            except subprocess.TimeoutExpired:
                pass


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0

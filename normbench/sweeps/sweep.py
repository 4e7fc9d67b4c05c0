"""Sweeps: ``normbench sweep`` is Hydra's multirun, made resumable and watchable.

Every job runs ``normbench.sweeps.job.task`` exactly like a ``train`` run. normbench's own Hydra
sweeper (``hydra/sweeper=normbench``: ``normbench.sweeps.planning``) plans the grid: a stable sweep
directory (``results/sweeps/NAME-HASH``) and one run directory per distinct config, so running the
same command again resumes it; it launches only the runs with something to do. Its local launcher
(``hydra/launcher=local``, the default; ``normbench.sweeps.launching``) runs them on warm workers;
Hydra's joblib, submitit and Ray launchers work unchanged.

This module is the command around it: ``run_sweep`` starts Hydra's multirun in a child process
(``normbench.sweeps.multirun``; its output goes to sweep.log), reads the plan the sweeper wrote,
and watches the run directories, so the display is the same whatever launcher runs the jobs and
wherever they run, as long as they write to this filesystem; then the closing table, and on
Ctrl-C one line saying what finished, what was interrupted and how to resume.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from normbench.core import provenance
from normbench.core.devices import available_cpus, local_parallel_jobs
from normbench.core.errors import ConfigError, first_line
from normbench.core.runs import (
    CONFIG,
    ERROR_LOG,
    INDEX,
    SUMMARY,
    RunDir,
    RunLock,
    describe_owner,
    run_status,
    write_index,
)
from normbench.sweeps import multirun
from normbench.sweeps.multirun import STOP_SIGNALS, sweep_owner
from normbench.sweeps.planning import Plan, check_args, mtime, plan_sweep, will_run

LOG = "sweep.log"
FINISHED = ("completed", "diverged", "failed")

STYLES = {
    "completed": "green",
    "diverged": "yellow",
    "failed": "red",
    "interrupted": "magenta",
    "pending": "dim",
    "running elsewhere": "cyan",
}

# ----------------------------------------------------------------------------- the sweep command


def _table(title: str, plan: Plan) -> Table:
    """A table with the job number and one column per swept key, which keep their width; the run dir
    gives way."""
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
        if job.batch and job.batch[0] != job.num and will_run(job, retry_failed):
            action = f"run, batched with #{job.batch[0]}"
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
        f"each run asks Ray for {count(int(want['CPU']), 'CPU')} and {count(int(want['GPU']), 'GPU')}, "
        f"but {where} "
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

    ``child``: the multirun, already started for these arguments (``normbench.sweeps.multirun.start``);
    by default it is started here."""
    console = console or Console()
    started = time.perf_counter()
    if dry_run:
        plan = plan_sweep(args)
        console.print(_plan_table(plan, retry_failed))
        console.print(_headline(plan, retry_failed), soft_wrap=True)
        _say_retraining(plan, console)
        _say_batching(plan, console)
        return 0
    child = child or multirun.start(args, retry_failed)
    try:
        check_args(args)
        said, before = multirun.read_plan(child)
        if "planned" not in said:
            return _failed_before_launch(child, said, before, console)
        plan = Plan.read(Path(said["planned"]))
    except KeyboardInterrupt:
        multirun.abandon(child)
        console.print("[yellow]interrupted[/yellow] while planning: no run had started")
        return 130
    except BaseException:
        multirun.abandon(child)
        raise
    todo = [j for j in plan.jobs if will_run(j, retry_failed)]
    console.print(_headline(plan, retry_failed), soft_wrap=True)
    _say_retraining(plan, console)
    _say_batching(plan, console)
    returncode, stops = 0, []
    if todo:
        returncode, stops = _launch(plan, console, poll_s, child, before)
    else:  # the sweeper launches nothing: its warming workers need not finish warming
        multirun.abandon(child)

    rows = write_index(plan.sweep_dir, final=True)
    by_dir = {r["run_dir"]: r for r in rows}
    states = [by_dir[job.run_dir.name]["status"] for job in plan.jobs if job.run_dir.name in by_dir]
    if stops:  # Ctrl-C: one line, no table
        console.print(_interrupted(plan, by_dir, args, retry_failed), soft_wrap=True, highlight=False)
        return 130
    console.print(_closing_table(plan, by_dir))
    for job in plan.jobs:
        row = by_dir.get(job.run_dir.name, {})
        if row.get("status") == "failed":
            what = " ".join(plan.values(job)) or job.run_dir.name
            console.print(
                Text.assemble(("failed", "red"), f" {what}: {row.get('error')} ({job.run_dir / ERROR_LOG})")
            )
    console.print(
        f"{_runs(len(states))}: {_counts(states)}{_efficiency(plan, started)}; "
        f"index: {plan.sweep_dir / INDEX}; compare them with: normbench report {plan.sweep_dir}",
        soft_wrap=True,
    )
    _account_for_others(plan, by_dir, console)
    if returncode in {128 + sig for sig in STOP_SIGNALS}:
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


def _headline(plan: Plan, retry_failed: bool) -> str:
    todo = [j for j in plan.jobs if will_run(j, retry_failed)]
    done = [j.state for j in plan.jobs if not will_run(j, retry_failed)]
    have = (
        f"{len(done)} {'has' if len(done) == 1 else 'have'} results ({_counts(done)})"
        if done
        else "none has results yet"
    )
    redo = [j.state for j in todo if j.state != "new"]
    line = f"{_runs(len(plan.jobs))} in {plan.sweep_dir}: {have}, {len(todo)} to run" + (
        f" ({_counts(redo)} among them)" if redo else ""
    )
    return line + _other_grids(plan)


def _other_grids(plan: Plan) -> str:
    """The runs the sweep directory holds that are none of this grid's (the same hydra.sweep.dir with
    other overrides): kept, and a report on the directory compares them too."""
    ours = {job.run_dir.name for job in plan.jobs}
    others = (
        [p for p in plan.sweep_dir.iterdir() if p.name not in ours and (p / CONFIG).is_file()]
        if plan.sweep_dir.is_dir()
        else []
    )
    if not others:
        return ""
    kept = "it is" if len(others) == 1 else "they are"
    return (
        f"\n{plan.sweep_dir} holds {_runs(len(others))} of another grid; {kept} kept "
        f"(normbench report {plan.sweep_dir} compares them too)"
    )


def _say_retraining(plan: Plan, console: Console) -> None:
    """One line on the runs whose stored results other code computed (their ``numerics`` differ):
    they are trained again, not reused."""
    stale = [j.stale for j in plan.jobs if j.stale is not None]
    if stale:
        older = "older" if max(stale) < provenance.NUMERICS else "other"
        versions = ", ".join(map(str, sorted(set(stale))))
        now = provenance.NUMERICS
        console.print(
            f"retraining {_runs(len(stale))} stored by {older} code (numerics {versions}, now {now})",
            soft_wrap=True,
            highlight=False,
        )


def _say_batching(plan: Plan, console: Console) -> None:
    """--batch-seeds: one line on the batched groups and on what trains one run at a time, and why."""
    from normbench.sweeps.batching import summary_line

    if line := summary_line(plan.jobs):
        console.print(line, soft_wrap=True, highlight=False)


def _failed_before_launch(child: subprocess.Popen, said: dict, output: list[bytes], console: Console) -> int:
    """The multirun ended before its sweeper made a plan: a mistake it told (a ConfigError), else Hydra's
    last line."""
    child.wait()
    child.stdout.close()
    if "error" in said:
        raise ConfigError(said["error"])
    lines = [line.decode(errors="replace").strip() for line in output if line.strip()]
    console.print(
        Text.assemble(("Hydra's multirun stopped with an error: ", "red"), lines[-1] if lines else "")
    )
    return 1


def _interrupted(plan: Plan, by_dir: dict[str, dict], args: list[str], retry_failed: bool) -> str:
    """Ctrl-C's one line: what finished, what was cut short, what never started, and the command that
    resumes."""
    states = {job.run_dir: by_dir.get(job.run_dir.name, {}).get("status", "pending") for job in plan.jobs}
    finished = sum(s in FINISHED for s in states.values())
    cut = [d for d, s in states.items() if s in ("interrupted", "running")]
    saved = sum(RunDir(d).checkpoint_step() is not None for d in cut)
    waiting = len(states) - finished - len(cut)
    command = shlex.join(["normbench", "sweep", *(["--retry-failed"] if retry_failed else []), *args])
    return (
        f"[yellow]interrupted[/yellow]: {finished} of {_runs(len(states))} finished, {len(cut)} interrupted"
        + (f" ({saved} with a checkpoint to resume from)" if saved else "")
        + (f", {waiting} not started" if waiting else "")
        + f"; resume with: {command}"
    )


def _efficiency(plan: Plan, started: float) -> str:
    """How much of the workers' time this sweep spent in the updates of the runs it trained
    (summary.json's time_s), start-up and waiting included (``training_share``). Empty for launchers
    whose workers are elsewhere, or when this sweep trained nothing."""
    workers = local_parallel_jobs(plan.launcher)
    steps = [
        (RunDir(job.run_dir).read_summary() or {}).get("time_s", {}).get("steps", 0.0)
        for job in plan.jobs
        if mtime(job.run_dir / SUMMARY) != plan.at_launch[job.run_dir][1]
        and RunLock(job.run_dir).last_owner().get("sweep") == sweep_owner()
    ]
    if not workers or not any(steps):
        return ""
    return training_share(steps, workers, time.perf_counter() - started)


def training_share(steps_s: list[float], workers: int, wall_s: float) -> str:
    """ "; 86% of the workers' time was training (2 workers for 79 s)": the runs' training steps
    against the time the workers were there for. A resumed run's time_s counts its steps before the
    resume too, time this sweep never saw: each run counts at most the sweep's wall time, and the share
    at most 100%."""
    share = min(100.0, 100 * sum(min(s, wall_s) for s in steps_s) / (workers * wall_s))
    return (
        f"; {share:.0f}% of the workers' time was training "
        f"({workers} worker{'s' if workers > 1 else ''} for {wall_s:.0f} s)"
    )


def _account_for_others(plan: Plan, by_dir: dict[str, dict], console: Console) -> None:
    """Say which runs another process trained or trains while this sweep ran (a second sweep on the
    same directory, a SLURM array still running): this sweep skipped them."""
    others: dict[str, list[str]] = {}
    for job in plan.jobs:
        status = by_dir.get(job.run_dir.name, {}).get("status")
        lock = RunLock(job.run_dir)
        if status == "running elsewhere":
            others.setdefault(lock.holder() or "another process", []).append(status)
        elif status in FINISHED and mtime(job.run_dir / SUMMARY) != plan.at_launch[job.run_dir][1]:
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
    plan: Plan, console: Console, poll_s: float, child: subprocess.Popen, before: list[bytes]
) -> tuple[int, list[float]]:
    """Copy the multirun's output into sweep.log and watch it; return its exit code and the times of
    the Ctrl-Cs it got (the first stops the jobs at a checkpoint, a second kills them at once)."""
    log = plan.sweep_dir / LOG
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} normbench sweep\n")
    console.print(f"[dim]Hydra's output: {log}[/dim]")
    output = multirun.copy_output(child, log, before)
    stops: list[float] = []
    previous = _forward_stop_signals(child, stops, console)
    try:
        _watch(plan, child, console, poll_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if stops and previous:
            # Stopped by Ctrl-C, the command is ending with 130 and has nothing left to stop: another press
            # while it writes its closing lines, or while the interpreter exits, changes nothing.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        # What the child leaves behind goes with it (idle workers of a launcher: they hold sweep.log's
        # pipe open); before it has ended, only if the watch itself failed.
        multirun.signal_group(child, signal.SIGKILL)
        output.join(timeout=10)  # the last lines in sweep.log before it is read
        if not output.is_alive():
            child.stdout.close()
    return child.returncode, stops


def _forward_stop_signals(proc: subprocess.Popen, stops: list[float], console: Console) -> dict:
    """SIGTERM/SIGUSR1 to the sweep command (a preempted SLURM job, say) go on to every job, which
    checkpoints and exits; the watch goes on until they have. Ctrl-C (SIGINT) too, noted in ``stops``;
    a second one kills every job at once. Returns the handlers to restore."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def forward(signum, frame):
        multirun.signal_group(proc, signum)

    def ctrl_c(signum, frame):
        stops.append(time.time())
        if len(stops) == 1:
            multirun.signal_group(proc, signal.SIGINT)
            console.print(
                "[yellow]stopping[/yellow]: the running runs save a checkpoint (Ctrl-C again to end at once)"
            )
        else:
            multirun.signal_group(proc, signal.SIGKILL)

    handlers = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    handlers[signal.SIGINT] = signal.signal(signal.SIGINT, ctrl_c)
    return handlers


def _watch(plan: Plan, proc: subprocess.Popen, console: Console, poll_s: float) -> None:
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
                config_then, summary_then = plan.at_launch[job.run_dir]
                summary_now = mtime(job.run_dir / SUMMARY)
                if job.run_dir in finished and finished[job.run_dir][0] == summary_now:
                    states.append(finished[job.run_dir][1])
                    continue
                state = run_status(job.run_dir)
                if state in FINISHED and summary_now:
                    finished[job.run_dir] = (summary_now, state)
                if state == "running" and mtime(job.run_dir / CONFIG) == config_then:
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

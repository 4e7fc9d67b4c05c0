"""A sweep's seeds as batched groups (``normbench sweep --batch-seeds``).

The plan (``normbench.sweeps.planning.make_plan``) marks every job whose config can train batched
(``normbench.training.batched.why_not``) with ``train.batched=true`` (part of its config hash, so
its run directory is its own), and records for the rest why not. Then it groups the marked jobs
with something to do that differ only in ``seed``: each group's first job, its leader, is the one
the sweeper launches; the others are in its ``batch`` and wait for it. The leader's job
(``train_group``, under any launcher) reads its group from plan.json, composes each member's
config as its own with the member's seed (checked against the member's planned config hash),
takes each member's run directory as a job takes its own (its lock, what it holds), and trains
them all in one batched model.
"""

from __future__ import annotations

import copy
import os
import traceback
from pathlib import Path

import torch
from omegaconf import DictConfig, open_dict

from normbench.core.errors import ConfigError
from normbench.core.identity import config_hash
from normbench.core.runs import RETRY_ENV, RunDir, RunLock

MARK = "train.batched=true"
OPTION = "hydra.sweeper.batch_seeds=true"  # --batch-seeds (normbench sweep, normbench claims run)


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def mark(job_cfg: DictConfig, overrides: list[str]) -> tuple[list[str], str | None]:
    """A job's overrides with ``train.batched=true`` when its config can train batched, and else why
    not (None for a config that is invalid anyway: it fails as it would have)."""
    from normbench.training.batched import why_not
    from normbench.training.config import checked

    if job_cfg.train.get("batched"):
        return overrides, None
    cfg = copy.deepcopy(job_cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    run, invalid = checked(cfg)
    if invalid:
        return overrides, None
    reason = why_not(run)
    return (overrides, reason) if reason else ([*overrides, MARK], None)


def pays(overrides: list[str]) -> bool:
    """Whether batching a sweep's seeds pays by default: on a CUDA device, where a small model's step
    is launch-bound and K seeds in one model multiply its tokens/s; not on a CPU, where a step at
    batch 32 is arithmetic that batching does not shrink (docs/benchmarks.md#batched-seeds)."""
    device = next((o.split("=", 1)[1] for o in reversed(overrides) if o.startswith("train.device=")), "auto")
    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def group(jobs: list, batched: set[int], will_run) -> None:
    """Set ``batch`` (the group's job numbers, the leader first) on every batched job with something
    to do; jobs of one group differ in ``seed`` only."""
    groups: dict[tuple, list] = {}
    for job in jobs:
        if job.num in batched and will_run(job):
            key = tuple(o for o in job.overrides if _key(o) != "seed")
            groups.setdefault(key, []).append(job)
    for members in groups.values():
        for job in members:
            job.batch = [m.num for m in members]


def launched(jobs: list) -> list:
    """The jobs the sweeper launches: every job but the batched groups' followers."""
    return [job for job in jobs if not job.batch or job.batch[0] == job.num]


def summary_line(jobs: list) -> str | None:
    """One line on what --batch-seeds made of the plan: the groups, and what trains one run at a time
    and why."""
    leaders = [j for j in jobs if j.batch and j.batch[0] == j.num]
    alone: dict[str, int] = {}
    for job in jobs:
        if job.unbatched:
            alone[job.unbatched] = alone.get(job.unbatched, 0) + 1
    if not leaders and not alone:
        return None
    seeds = sum(len(j.batch) for j in leaders)
    line = f"--batch-seeds: {seeds} runs in {len(leaders)} batched group{'s' if len(leaders) != 1 else ''}"
    if alone:
        why = "; ".join(reason if len(alone) == 1 else f"{n}: {reason}" for reason, n in alone.items())
        line += f"; {sum(alone.values())} one at a time ({why})"
    return line


# ----------------------------------------------------------------------------- in the leader's job


def members(cfg: DictConfig, run_dir: Path, plan) -> list[tuple[DictConfig, Path, str]]:
    """The other members of the batched group ``run_dir`` leads, as (config, run directory, config hash),
    from the sweep's plan (normbench.sweeps.planning.Plan); none outside a sweep (no plan) or for a
    group of one."""
    if plan is None:
        return []
    by_num = {job.num: job for job in plan.jobs}
    own = next((job for job in plan.jobs if job.run_dir.name == run_dir.name), None)
    if own is None or not own.batch or own.batch[0] != own.num:
        return []
    out = []
    for num in own.batch[1:]:
        job = by_num[num]
        seed = next(o.split("=", 1)[1] for o in job.overrides if _key(o) == "seed")
        member = copy.deepcopy(cfg)
        with open_dict(member):
            member.seed = int(seed)
        if config_hash(member) != job.config_hash:
            raise ConfigError(
                f"batched seeds: {job.run_dir.name} is not {run_dir.name}'s config with seed={seed}"
            )
        out.append((member, job.run_dir, job.config_hash))
    return out


def train_group(run, run_dir: Path, cfg: DictConfig, console, plan, adjust) -> dict:
    """Train ``run`` (in ``run_dir``, prepared by its job) with the members of its batched group;
    return its summary. ``adjust(run)`` sets what a sweep job sets on its own run (threads, progress)."""
    from normbench.training.batched import train_batched
    from normbench.training.config import parse_config

    runs, dirs, locks = [run], [run_dir], []
    try:
        for member, member_dir, member_hash in members(cfg, run_dir, plan):
            lock = RunLock(member_dir)
            if holder := lock.acquire():
                console.print(f"running elsewhere: {holder}: {member_dir} (skipped)", soft_wrap=True)
                continue
            locks.append(lock)
            decision = RunDir(member_dir).decide(
                member_hash, sweep=True, retry=os.environ.get(RETRY_ENV) == "1"
            )
            if decision.action == "reuse":
                continue
            lock.claim()
            member_dirs = RunDir(member_dir)
            member_dirs.prepare(decision)  # a seed with a checkpoint resumes with its group
            member_dirs.write_config(member)
            member_run = parse_config(member, member_hash)
            adjust(member_run)
            runs.append(member_run)
            dirs.append(member_dir)
        try:
            return train_batched(runs, dirs, console)[0]
        except Exception as err:  # failed before training: every member's directory says so
            for member_run, member_dir in zip(runs[1:], dirs[1:]):
                RunDir(member_dir).write_failure(
                    f"{type(err).__name__}: {err}", traceback.format_exc(), member_run.config_hash
                )
            raise
    finally:
        for lock in locks:
            lock.release()

"""Run storage: one directory per run, written so that a crash or a kill never corrupts it.

    config.yaml     the resolved config (written before training starts)
    metrics.jsonl   one JSON object per line, appended and flushed as training goes
    checkpoint.pt   where training stands (normbench.training.checkpoint), while it runs; with
                    checkpoint.prev.pt, the one before
    summary.json    written once at the end, atomically (temp file + rename); the
                    checkpoints go then
    model.pt        the final weights (train.save_model=true)
    error.log       the traceback of a run that failed

A run directory is complete exactly when summary.json exists. ``RunDir.decide`` is the one
place that says what a run does with its directory (reuse a result, resume, start afresh
or refuse); the job, the sweep's plan and training all ask it. This module also holds the
index of a sweep directory's runs (``write_index``), which every job rebuilds.
"""

from __future__ import annotations

import csv
import io
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from normbench.core import provenance
from normbench.core.fileio import finite_or_none, read_jsonl, write_atomic
from normbench.core.identity import config_hash

CONFIG, METRICS, SUMMARY, ERROR_LOG = "config.yaml", "metrics.jsonl", "summary.json", "error.log"
CHECKPOINT, PREVIOUS, MODEL = "checkpoint.pt", "checkpoint.prev.pt", "model.pt"
CHECKPOINT_TEMPORARY = f".{CHECKPOINT}.*.tmp"  # a checkpoint being written (atomic_file's name for it)
LOCK = ".lock"  # who owns the run directory now (RunLock)
PLAN, INDEX = "plan.json", "index.csv"  # in a sweep directory
# What Hydra writes into a run directory before the job runs: the composed config and the job's log
# (hydra.job.name is normbench, conf/config.yaml)
HYDRA_FILES = (".hydra", "normbench.log")
TENSORBOARD_EVENTS = "events.out.tfevents."  # logger=tensorboard's files (normbench.training.sinks)
RETRY_ENV = "NORMBENCH_RETRY_FAILED"  # set in every sweep job (hydra.job.env_set), so it reaches any launcher
SWEEP_ENV = "NORMBENCH_SWEEP_OWNER"  # "pid@host" of the sweep command a job belongs to (RunLock records it)
# How far below the unigram loss a run must end to have used its context: a model that ignores it (a
# norm that hands attention nothing) ends at or above that loss, the loss of predicting each token's
# frequency.
LEARN_MARGIN = 0.1


class RunLock:
    """One owner per run directory: an exclusive ``flock`` on RUN_DIR/.lock, held for the run's life.

    The kernel drops the lock when its process dies, whatever the death (kill -9 included), so
    a lock is never stale. ``flock`` rather than POSIX ``lockf``: a POSIX lock is per process (a
    second open in the same process would get it too, and closing any descriptor of the file
    drops it), a flock is per open file. On NFS the Linux client turns flock into a whole-file
    POSIX lock the server arbitrates, so two hosts exclude each other; Lustre needs its ``flock``
    mount option, and a filesystem mounted ``nolock`` or ``localflock`` makes it per host only
    (docs/sweeps.md#one-owner-per-run-directory). The file holds its owner (pid, host, and the
    sweep command it belongs to) and stays when the run ends: deleting it would race the next owner.
    """

    def __init__(self, run_dir: Path | str):
        self.path = Path(run_dir) / LOCK
        self.file = None

    def acquire(self) -> str | None:
        """Take the lock: None when taken, else who holds it ("pid 123 on host h", or "another process"
        before the holder has claimed the run)."""
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        file = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (held open: the lock lives with it)
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            file.close()
            return describe_owner(self.last_owner())
        self.file = file
        return None

    def claim(self) -> None:
        """Name this process as the owner in the lock file: once it is going to train here (a run that is
        refused or reuses a result leaves the file as it was)."""
        self.file.seek(0)
        self.file.truncate()
        self.file.write(
            json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "sweep": os.environ.get(SWEEP_ENV)})
            + "\n"
        )
        self.file.flush()

    def release(self) -> None:
        if self.file is not None:
            self.file.close()  # closing the descriptor drops the flock
            self.file = None

    def holder(self) -> str | None:
        """Who holds the lock now ("pid 123 on host h"), or None when nobody does (probed, not taken)."""
        if not self.path.exists():
            return None
        held = self.acquire()
        self.release()
        return held

    def last_owner(self) -> dict:
        """The owner the lock file names: the live one, or the last one to have run here."""
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}


def describe_owner(owner: dict) -> str:
    """A lock file's owner for a person: "pid 123 on node3" (or "another process" before it claimed the
    run)."""
    return (
        f"pid {owner['pid']} on {owner['host']}" if "pid" in owner and "host" in owner else "another process"
    )


@dataclass
class Decision:
    """``RunDir.decide``'s answer: reuse, resume, fresh or refuse (and why)."""

    action: str
    result: dict | None = None  # the stored result of this config, if any
    reason: str | None = None  # refuse: what to do instead
    stale: int | None = None  # the numerics of a stored result of this config by other code (not reused)


class RunDir:
    def __init__(self, path: Path | str):
        self.path = Path(path)

    def write_config(self, cfg: DictConfig) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path / CONFIG, OmegaConf.to_yaml(cfg, resolve=True))

    def write_summary(self, summary: dict) -> None:
        write_atomic(
            self.path / SUMMARY, json.dumps(finite_or_none(summary), indent=2, allow_nan=False) + "\n"
        )

    def write_failure(self, error: str, details: str, cfg_hash: str | None) -> None:
        """A run that failed before it could train: error.log holds ``details``, summary.json says failed
        (never completed), so a sweep's index and a report show it."""
        self.write_error(details)
        # which code failed it: a failure of this code's numerics is not an older run's (the report and a
        # sweep's reuse read the numerics of every summary)
        commit, dirty = provenance.git_state()
        block = {"commit": commit, "dirty": dirty, "numerics": provenance.NUMERICS}
        self.write_summary({"status": "failed", "error": error, "config_hash": cfg_hash, "provenance": block})

    def read_summary(self) -> dict | None:
        """The summary, or None when there is none yet (running, killed) or it is unreadable."""
        try:
            return json.loads((self.path / SUMMARY).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def read_metrics(self) -> list[dict]:
        return read_jsonl(self.path / METRICS)

    def write_error(self, text: str) -> None:
        write_atomic(self.path / ERROR_LOG, text)

    def remove_checkpoints(self) -> None:
        """Drop the checkpoints (and the temp file a kill mid-write leaves): the run ended or starts over."""
        for path in [self.path / CHECKPOINT, self.path / PREVIOUS, *self.path.glob(CHECKPOINT_TEMPORARY)]:
            path.unlink(missing_ok=True)

    def checkpoint_step(self) -> int | None:
        """The step the run would resume at: for listings."""
        step = self._checkpoint_field("step")
        return None if step is None else int(step)

    def checkpoint_hash(self) -> str | None:
        """The config hash the checkpoint here was saved for."""
        saved_for = self._checkpoint_field("config_hash")
        return None if saved_for is None else str(saved_for)

    def _checkpoint_field(self, key: str):
        """One field of the newest readable checkpoint, read cheaply (memory-mapped, not verified)."""
        import torch  # here, not above: the report reads run directories without loading torch

        for name in (CHECKPOINT, PREVIOUS):
            try:
                return torch.load(self.path / name, map_location="cpu", weights_only=True, mmap=True)[key]
            except Exception:  # absent, or damaged: loading it for real would say so
                continue
        return None

    def config_hash(self) -> str | None:
        """The hash of the config.yaml stored here; None when missing or unreadable (edited by hand)."""
        try:
            return config_hash(OmegaConf.load(self.path / CONFIG))
        except Exception:
            return None

    def decide(
        self, cfg_hash: str, *, sweep: bool = False, retry: bool = False, resume: str = "auto"
    ) -> Decision:
        """What a run of config ``cfg_hash`` does with this directory: the one place that says so.

        - ``reuse``: a result of this very config is here: completed, or diverged or failed unless
          ``retry`` (--retry-failed), for a sweep job (``sweep``); completed or diverged for a single
          run with ``resume`` auto (train.resume=never trains it again);
        - ``refuse``: a single run finds a run of another config: a result (whatever ``resume``: a
          run directory never loses a result, nor one whose config.yaml is missing or unreadable),
          or with ``resume`` auto a checkpoint or an unfinished
          run (training would either mix it into this run or destroy it). A sweep job's directory is
          named after its config, so anything else in it is stale: ``fresh``;
        - ``resume``: this config started here and has no result: training continues from its
          checkpoint (``resume`` auto), when a sound one is found;
        - ``fresh``: anything else; ``prepare`` clears what is here. A result of this config whose
          ``numerics`` (normbench.core.provenance) are not the code's is another computation: it is
          trained again (``stale`` says which numerics it had).

        ``result`` is the stored result of this config whatever the action (a sweep's plan shows it).
        """
        summary, stored = self.read_summary(), self.config_hash()
        result = summary if summary is not None and stored == cfg_hash else None
        if result is not None and provenance.numerics_of(result) != provenance.NUMERICS:
            return Decision("fresh", stale=provenance.numerics_of(result))
        if result is not None and self._reusable(result, sweep, retry, resume):
            return Decision("reuse", result)
        if not sweep and (other := self._other_config(cfg_hash, summary, stored, resume)):
            return Decision(
                "refuse",
                result,
                f"{self.path} holds {other}: give this run its own directory "
                "(hydra.run.dir=...)"
                + (" or start it over there with train.resume=never" if summary is None else ""),
            )
        if resume != "auto":
            return Decision("fresh", result)
        saved_for = self.checkpoint_hash()
        # a checkpoint whose hash can't be read: loading it says why, and training starts afresh
        damaged = saved_for is None and ((self.path / CHECKPOINT).exists() or (self.path / PREVIOUS).exists())
        if result is None and (
            saved_for == cfg_hash or (saved_for is None and (stored == cfg_hash or damaged))
        ):
            return Decision("resume", result)
        return Decision("fresh", result)

    @staticmethod
    def _reusable(result: dict, sweep: bool, retry: bool, resume: str) -> bool:
        """Whether a stored result of this config stands for the run: a sweep keeps its results (failed ones
        unless --retry-failed); a single run keeps what training would compute again (completed,
        diverged) unless train.resume=never, and tries a failed one again."""
        status = result.get("status")
        if sweep:
            return status == "completed" or not retry
        return resume == "auto" and status in ("completed", "diverged")

    def _other_config(
        self, cfg_hash: str, summary: dict | None, stored: str | None, resume: str
    ) -> str | None:
        """What of another config this directory holds that a single run must not replace: its result, or
        (``resume`` auto) its checkpoint or unfinished run; None when nothing."""
        if summary is not None:  # config.yaml says whose; a result without a readable one is still a result
            if stored == cfg_hash:
                return None
            whose = (
                "of another config" if stored is not None else "whose config.yaml is missing or unreadable"
            )
            return f"a {summary.get('status') or 'stored'} run {whose}"
        if resume != "auto":
            return None
        if self.checkpoint_hash() not in (None, cfg_hash):
            return "a checkpoint of another config"
        return "an unfinished run of another config" if stored not in (None, cfg_hash) else None

    def prepare(self, decision: Decision) -> None:
        """Make the directory ready to train after ``decide``: keep what a resume needs, clear the rest."""
        assert decision.action in ("resume", "fresh"), decision
        self.path.mkdir(parents=True, exist_ok=True)
        # summary first: a kill now leaves an interrupted run, not a stale result
        for name in (
            (SUMMARY, ERROR_LOG) if decision.action == "resume" else (SUMMARY, METRICS, ERROR_LOG, MODEL)
        ):
            (self.path / name).unlink(missing_ok=True)
        if decision.action == "fresh":
            self.remove_checkpoints()
            # an earlier run's TensorBoard events: TensorBoard would draw them as this run's
            for events in self.path.glob(f"{TENSORBOARD_EVENTS}*"):
                events.unlink()

    def holds_nothing(self) -> bool:
        """No run here: no such directory, or only what Hydra writes for any command (``HYDRA_FILES``)
        and a lock."""
        return not self.path.is_dir() or all(p.name in (*HYDRA_FILES, LOCK) for p in self.path.iterdir())


# ----------------------------------------------------------------------------- the index of a sweep directory


def run_status(run_dir: Path, summary: dict | None = None) -> str:
    """What a run directory says now: completed/diverged/failed, running (started, no result yet) or pending.
    ``summary``: its summary, when the caller has read it."""
    summary = summary if summary is not None else RunDir(run_dir).read_summary()
    if summary is not None:
        return summary.get("status") or "failed"
    return "running" if (Path(run_dir) / CONFIG).exists() else "pending"


def _indexed_jobs(sweep_dir: Path) -> list[dict]:
    """Every run of the sweep directory: the jobs of plan.json (the grid ``normbench sweep`` launched
    last), then each other run directory found there (an earlier grid's: no job number)."""
    try:
        jobs = json.loads((sweep_dir / PLAN).read_text(encoding="utf-8"))["jobs"]
    except (OSError, ValueError, KeyError):
        jobs = []
    planned = {job["run_dir"] for job in jobs}
    found = sorted(
        {p.parent.parent for p in sweep_dir.glob("*/.hydra/overrides.yaml")}
        | {p.parent for p in sweep_dir.glob(f"*/{CONFIG}")}
    )
    for run_dir in found:
        if run_dir.name not in planned:
            overrides_file = run_dir / ".hydra" / "overrides.yaml"
            overrides = list(OmegaConf.load(overrides_file)) if overrides_file.is_file() else []
            jobs.append({"job": None, "overrides": overrides, "run_dir": run_dir.name})
    return jobs


def write_index(sweep_dir: Path, final: bool = False) -> list[dict]:
    """Rebuild index.csv from the run directories (atomic, so parallel jobs may all do it).

    One row per job: its overrides, status, run directory (relative to the sweep), config
    hash, final loss, wall time, error, and for a run that has not finished the step its
    checkpoint would resume it at (``resume_step``). ``final`` (the sweep has ended) reports
    a run that started and never finished as interrupted rather than running.
    """
    sweep_dir = Path(sweep_dir)
    rows = []
    for job in _indexed_jobs(sweep_dir):
        run_dir = sweep_dir / job["run_dir"]
        summary = RunDir(run_dir).read_summary() or {}
        status = run_status(run_dir, summary or None)
        if final and status == "running":  # the sweep has ended: the run is someone else's, or was cut short
            status = "running elsewhere" if RunLock(run_dir).holder() else "interrupted"
        rows.append(
            {
                "job": job.get("job"),
                "status": status,
                "overrides": " ".join(job["overrides"]),
                "run_dir": job["run_dir"],
                "config_hash": summary.get("config_hash") or job.get("config_hash"),
                "final_val_loss": summary.get("final_val_loss"),
                "wall_s": summary.get("wall_s"),
                "error": summary.get("error"),
                "resume_step": RunDir(run_dir).checkpoint_step()
                if status in ("running", "interrupted")
                else None,
            }
        )
    text = io.StringIO()
    writer = csv.DictWriter(
        text,
        fieldnames=[
            "job",
            "status",
            "overrides",
            "run_dir",
            "config_hash",
            "final_val_loss",
            "wall_s",
            "error",
            "resume_step",
        ],
        lineterminator="\n",
    )
    writer.writeheader()
    writer.writerows(rows)
    if sweep_dir.is_dir():
        write_atomic(sweep_dir / INDEX, text.getvalue())
    return rows


def read_index(sweep_dir: Path) -> list[dict]:
    with open(Path(sweep_dir) / INDEX, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))

"""Run storage: one directory per run, written so that a crash or a kill never corrupts it.

    config.yaml     the resolved config (written before training starts)
    metrics.jsonl   one JSON object per line, appended and flushed as training goes
    checkpoint.pt   where training stands (normbench.checkpoint), while it runs; with
                    checkpoint.prev.pt, the one before
    summary.json    written once at the end, atomically (temp file + rename); the
                    checkpoints go then
    model.pt        the final weights (train.save_model=true)
    error.log       the traceback of a run that failed

A run directory is complete exactly when summary.json exists. This module also holds
the rules a job applies to its directory before training (``prepare_job``: reuse a
result, resume an interrupted run) and the index of a sweep directory's runs
(``write_index``), which every job rebuilds.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

CONFIG, METRICS, SUMMARY, ERROR_LOG = "config.yaml", "metrics.jsonl", "summary.json", "error.log"
CHECKPOINT, PREVIOUS, MODEL = "checkpoint.pt", "checkpoint.prev.pt", "model.pt"
PLAN, INDEX = "plan.json", "index.csv"  # in a sweep directory
RETRY_ENV = "NORMBENCH_RETRY_FAILED"  # set in every sweep job (hydra.job.env_set), so it reaches any launcher


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write a file so readers see the old content or the new one, never half of it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600; results are meant to be read by colleagues on shared storage.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _finite_or_none(value):
    """JSON has no NaN or infinity: a diverged loss is recorded as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def to_json(record: dict) -> str:
    return json.dumps(_finite_or_none(record), allow_nan=False)


def read_jsonl(path: Path, on_torn_tail=None) -> list[dict]:
    """Every record of a JSONL log. A torn last line (a kill mid-write) is dropped, and
    reported to ``on_torn_tail(message)``; a bad line before the last means a corrupt file (ValueError)."""
    lines = [line for line in Path(path).read_bytes().decode("utf-8", errors="replace").splitlines() if line.strip()]
    records = []
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError:
            if i < len(lines) - 1:
                raise ValueError(f"line {i + 1} of {Path(path).name} is not JSON") from None
            if on_torn_tail:
                on_torn_tail(f"{path}: ignored a truncated last line")
            break
        if isinstance(record, dict):
            records.append(record)
    return records


class RunDir:
    def __init__(self, path: Path | str):
        self.path = Path(path)

    def write_config(self, cfg: DictConfig) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path / CONFIG, OmegaConf.to_yaml(cfg, resolve=True))

    def write_summary(self, summary: dict) -> None:
        write_atomic(self.path / SUMMARY, json.dumps(_finite_or_none(summary), indent=2, allow_nan=False) + "\n")

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
        for path in [self.path / CHECKPOINT, self.path / PREVIOUS, *self.path.glob(f".{CHECKPOINT}.*.tmp")]:
            path.unlink(missing_ok=True)

    def checkpoint_step(self) -> int | None:
        """The step the run would resume at, read cheaply (memory-mapped, not verified): for listings."""
        for name in (CHECKPOINT, PREVIOUS):
            try:
                return int(torch.load(self.path / name, map_location="cpu", weights_only=True, mmap=True)["step"])
            except Exception:  # absent, or damaged: training would say so
                continue
        return None

    def holds_checkpoint_of_another(self, cfg_hash: str) -> bool:
        """A checkpoint here, of a config (its config.yaml) other than ``cfg_hash``'s."""
        has = (self.path / CHECKPOINT).exists() or (self.path / PREVIOUS).exists()
        return has and self.config_hash() not in (None, cfg_hash)

    def config_hash(self) -> str | None:
        """The hash of the config.yaml stored here; None when missing or unreadable (edited by hand)."""
        from normbench.config import config_hash  # config imports train, which imports this module

        try:
            return config_hash(OmegaConf.load(self.path / CONFIG))
        except Exception:
            return None


# ----------------------------------------------------------------------------- a job's rules for its directory


def stored_result(run_dir: Path, cfg_hash: str) -> dict | None:
    """The summary in ``run_dir`` if it is a result of this very config (same hash), else None."""
    run = RunDir(run_dir)
    summary = run.read_summary()
    # config.yaml is rewritten before a run starts and summary.json only after it ends,
    # so the two always belong to the same attempt.
    if summary is None or run.config_hash() != cfg_hash:
        return None
    return summary


def prepare_job(run_dir: Path, cfg_hash: str) -> dict | None:
    """Return the result to reuse (the job is skipped), or make the directory ready to train and return None.

    Completed results are always reused; diverged and failed ones too, unless the sweep
    runs with --retry-failed. A run of this config killed half-way keeps its metrics and
    checkpoint, and training resumes from them (train.resume=auto). Anything else (a
    retried result, the files of another config) is cleared for a fresh run.
    """
    run = RunDir(run_dir)
    result = stored_result(run.path, cfg_hash)
    retry = os.environ.get(RETRY_ENV) == "1"
    if result is not None and (result.get("status") == "completed" or not retry):
        return result
    resumable = result is None and run.config_hash() == cfg_hash
    # summary first: a kill now leaves an interrupted run, not a stale result
    for name in (SUMMARY, ERROR_LOG) if resumable else (SUMMARY, METRICS, ERROR_LOG):
        (run.path / name).unlink(missing_ok=True)
    if not resumable:
        run.remove_checkpoints()
    return None


# ----------------------------------------------------------------------------- the index of a sweep directory


def run_status(run_dir: Path) -> str:
    """What a run directory says now: completed/diverged/failed, running (started, no result yet) or pending."""
    summary = RunDir(run_dir).read_summary()
    if summary is not None:
        return summary.get("status") or "failed"
    return "running" if (Path(run_dir) / CONFIG).exists() else "pending"


def _indexed_jobs(sweep_dir: Path) -> list[dict]:
    """The sweep's jobs: from plan.json when normbench sweep launched it, else every job directory found."""
    try:
        return json.loads((sweep_dir / PLAN).read_text(encoding="utf-8"))["jobs"]
    except (OSError, ValueError, KeyError):
        pass
    jobs = []
    for overrides_file in sorted(sweep_dir.glob("*/.hydra/overrides.yaml")):
        run_dir = overrides_file.parent.parent
        jobs.append({"job": None, "overrides": list(OmegaConf.load(overrides_file)), "run_dir": run_dir.name})
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
        status = run_status(run_dir)
        if final and status == "running":
            status = "interrupted"
        rows.append({
            "job": job.get("job"),
            "status": status,
            "overrides": " ".join(job["overrides"]),
            "run_dir": job["run_dir"],
            "config_hash": summary.get("config_hash") or job.get("config_hash"),
            "final_val_loss": summary.get("final_val_loss"),
            "wall_s": summary.get("wall_s"),
            "error": summary.get("error"),
            "resume_step": RunDir(run_dir).checkpoint_step() if status in ("running", "interrupted") else None,
        })
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=["job", "status", "overrides", "run_dir", "config_hash",
                                              "final_val_loss", "wall_s", "error", "resume_step"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    if sweep_dir.is_dir():
        write_atomic(sweep_dir / INDEX, text.getvalue())
    return rows


def read_index(sweep_dir: Path) -> list[dict]:
    with open(Path(sweep_dir) / INDEX, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))



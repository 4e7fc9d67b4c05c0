"""Checkpoints: everything a run needs to continue exactly where it stopped, and ``Checkpoints``, the
one owner of a run directory's checkpoint files.

``checkpoint.pt`` in the run directory holds the model (BatchNorm buffers included), the
optimizer, the LR schedule, the gradient scaler, the step, every RNG state that feeds
training (torch's CPU and CUDA generators, per rank, and the batch generator), the
loop's own state (losses not yet logged, timer, the losses the summary is made of) and
the length metrics.jsonl had, so a resumed run cuts the log back to that point.

It holds tensors, numbers, strings, lists and dicts only: ``torch.load(weights_only=True)``
reads it. It is written atomically, the one before it kept as ``checkpoint.prev.pt``, and the
directory synced after the renames. The file is torch.save's zip archive, whose every record (each
tensor's bytes, the pickle of the rest) carries the CRC-32 torch.save computes as it writes; ``load``
checks them all before trusting the file, so a file that is truncated, unreadable or altered is
skipped with a warning for the previous one, or for a fresh start, never resumed from. The checksums
cost no pass of their own over the state (a separate SHA-256 of the contents would add 1.2 s of CPU to
each checkpoint at 124M parameters).

A checkpoint is written on the training thread, at its priority: the loop never waits on another
thread. A writer thread at idle priority gets no CPU while training's threads want it all, so on a busy
machine a loop waiting for it waits for minutes; at normal priority it takes a core from training's
threads, which then wait for it at each parallel region. A synchronous save costs what it costs (1.5-5
s at 124M parameters on a CPU) every ``train.checkpoint_minutes``: benchmarks/checkpoint_blocking.py
measures both, quiet and with busy processes on the cores.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from normbench.core.errors import ConfigError, first_line
from normbench.core.fileio import atomic_file
from normbench.core.runs import CHECKPOINT, CHECKPOINT_TEMPORARY, METRICS, MODEL, PREVIOUS, RunDir
from normbench.training import distributed

FORMAT = 2  # 1 carried a SHA-256 of its contents; 2 relies on the archive's CRC-32s


class Checkpoints:
    """A run directory's checkpoints: save (keeping the last two), load, which one a run resumes from,
    and the temporary file a kill mid-write leaves (removed when the run starts or resumes, before
    anything is written).

    ``saved`` is the step of the newest checkpoint complete on disk (None: none yet). A write that
    fails, whatever the cause (a full disk, a state that cannot be pickled), costs that checkpoint, not
    the run: ``warn`` says so with the step saved last, and ``save`` returns False."""

    def __init__(self, run_dir: Path, warn: Callable[[str], None], saved: int | None = None):
        self.run_dir, self.warn, self.saved = Path(run_dir), warn, saved
        self.failure: str | None = None  # why the last save failed, until one succeeds

    def remove_stale(self) -> None:
        """The temporary files of a write that was killed: never complete, never read."""
        for path in self.run_dir.glob(CHECKPOINT_TEMPORARY):
            path.unlink(missing_ok=True)

    def remove(self) -> None:
        """Every checkpoint file: the run ended (its summary is the result) or starts over."""
        RunDir(self.run_dir).remove_checkpoints()

    def load(self) -> dict | None:
        """The newest valid checkpoint (the previous one if the newest is damaged), or None."""
        return load(self.run_dir, self.warn)

    def resumable(self, config_hash: str, resume: str) -> dict | None:
        """The checkpoint a run of ``config_hash`` resumes from, where ``RunDir.decide`` says it resumes
        (``train.resume``) and the checkpoint is sound; else None, every checkpoint file removed. A
        killed write's temporary file goes first. A damaged checkpoint, or a metrics.jsonl shorter than
        the checkpoint says, means a fresh start with a warning; another config's is refused (never
        mixed into this run), as is a directory ``decide`` refuses."""
        self.remove_stale()
        run_dir, saved = RunDir(self.run_dir), None
        decision = run_dir.decide(config_hash, resume=resume)
        if decision.action == "refuse":
            raise ConfigError(decision.reason)
        if decision.action == "resume":
            saved = self.load()
        if saved is not None and saved["config_hash"] != config_hash:
            raise ConfigError(f"{self.run_dir}: the checkpoint of step {saved['step']} is of another config")
        metrics = self.run_dir / METRICS
        have = metrics.stat().st_size if metrics.exists() else 0
        if saved is not None and have < saved["metrics_bytes"]:
            self.warn(
                f"{metrics} is shorter ({have} bytes) than at the checkpoint of step {saved['step']} "
                f"({saved['metrics_bytes']} bytes); starting afresh"
            )
            saved = None
        if saved is None:
            self.remove()
        self.saved = None if saved is None else saved["step"]
        return saved

    def save(self, step: int, state: dict) -> bool:
        """Write ``state`` as the checkpoint of ``step``; whether it is on disk."""
        try:
            save(self.run_dir, state)
        except Exception as err:  # any failure costs the checkpoint only, and is said with the last saved
            last = f"the last saved is step {self.saved}" if self.saved is not None else "none is saved yet"
            self.failure = first_line(err)
            self.warn(f"checkpoint at step {step} not written ({self.failure}); {last}")
            return False
        self.saved, self.failure = step, None
        return True


def save(run_dir: Path, state: dict) -> int:
    """Write ``state`` as the run's checkpoint, atomically, keeping the last one; return its size in bytes.

    The file is written and synced under a temporary name first; only then is the last checkpoint
    moved to checkpoint.prev.pt and the new one renamed into place, and the directory synced (the
    renames are on disk). A kill anywhere leaves the last complete checkpoint (or the one before it)
    for load(), never a torn checkpoint.pt; an error removes the temporary file.
    """
    path = Path(run_dir) / CHECKPOINT

    def keep_previous():
        if path.exists():
            os.replace(path, Path(run_dir) / PREVIOUS)

    with atomic_file(path, keep_previous) as f:
        stream = _Stream(f)
        torch.save({**state, "format": FORMAT}, stream)
        error, stream.error = stream.error, None
        if error is not None:
            try:
                raise error  # the disk's OSError (DiskFull from atomic_file)
            finally:  # no frame keeps the error whose traceback holds it: the state is freed at once
                error = None
        size = f.tell()  # atomic_file syncs what is left and renames the file into place
    _sync_directory(Path(run_dir))
    return size


def _sync_directory(directory: Path) -> None:
    """The directory's entries on disk: a rename is durable only once its directory is synced."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Stream:
    """The file torch.save writes a checkpoint through. Every SYNC_BYTES the file is synced and its
    pages dropped from the page cache: the closing sync has little left, and the pages written are
    recycled rather than 1.4 GiB of fresh page cache allocated per checkpoint (evicting the token
    shards training reads): at 124M on a 2-core VM a checkpoint takes 1.6 s of CPU instead of 2.6 s.

    A write that fails is kept in ``error`` and every later write dropped: torch.save runs to its end
    (the rest costs its CRC-32s, no disk), and ``save`` raises the error. Raised into torch.save's C++
    writer instead, an error would come back as one of the archive's own, and keep the state being
    saved alive for good."""

    SYNC_BYTES = 64 * 2**20

    def __init__(self, f):
        self.f = f
        self.synced = 0  # the file's length at its last sync
        self.error: Exception | None = None

    def write(self, data) -> int:
        if self.error is None:
            try:
                self._write(data)
            except OSError as err:
                self.error = err.with_traceback(None)
        return memoryview(data).nbytes

    def _write(self, data) -> None:
        self.f.write(data)
        if self.f.tell() - self.synced >= self.SYNC_BYTES:
            self.f.flush()
            os.fsync(self.f.fileno())
            if hasattr(os, "posix_fadvise"):  # the synced pages leave the page cache
                os.posix_fadvise(self.f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            self.synced = self.f.tell()

    def flush(self) -> None:
        if self.error is None:
            self.f.flush()


def save_weights(run_dir: Path, model: torch.nn.Module) -> int:
    """The final weights as ``model.pt`` (a state dict), for analysis after the run."""
    with atomic_file(Path(run_dir) / MODEL) as f:
        torch.save(model.state_dict(), f)
        return f.tell()


def _read(path: Path) -> dict:
    """One checkpoint file, verified; raises ValueError saying what is wrong with it."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()  # the first record whose bytes do not match its CRC-32
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, garbage, a pickle of disallowed types
        raise ValueError(f"unreadable ({first_line(err)})") from None
    if damaged is not None:
        raise ValueError(f"its record {damaged} does not match its checksum (corrupted)")
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError("not a normbench checkpoint of this version")
    return state


def load(run_dir: Path, warn) -> dict | None:
    """The newest valid checkpoint in ``run_dir`` (the previous one if the newest is damaged), or None.

    Each damaged file is reported through ``warn(message)``.
    """
    for name in (CHECKPOINT, PREVIOUS):
        path = Path(run_dir) / name
        if not path.exists():
            continue
        try:
            return _read(path)
        except ValueError as err:
            warn(f"{path}: {err}; not resuming from it")
    return None


# ----------------------------------------------------------------------------- a run's state


def capture(run) -> dict:
    """A training ``Run``'s model (BatchNorm buffers included), optimizer, LR schedule, scaler and RNG
    streams, for a checkpoint. A collective under torchrun: every rank's dropout RNG is gathered."""
    return {
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "scaler": run.scaler.state_dict(),
        "batch_gen": run.batch_gen.get_state(),
        "rng": distributed.gather(rng_state(run.device)),
    }


def restore(run, saved: dict, console) -> None:
    """``capture``'s state back into a training ``Run``; each rank its own dropout RNG (a rank the
    checkpoint had not draws from a seed of its own, and says so)."""
    run.model.load_state_dict(saved["model"])
    run.optimizer.load_state_dict(saved["optimizer"])
    run.scheduler.load_state_dict(saved["scheduler"])
    run.scaler.load_state_dict(saved["scaler"])
    run.batch_gen.set_state(saved["batch_gen"])
    rngs, rank = saved["rng"], distributed.rank()
    if len(rngs) != distributed.world_size() and distributed.is_main():
        console.print(
            f"[yellow]resuming with {distributed.world_size()} processes a checkpoint of {len(rngs)}: "
            "dropout draws differ from an uninterrupted run[/yellow]"
        )
    if rank < len(rngs):
        set_rng_state(rngs[rank], run.device)
    else:
        torch.manual_seed(run.cfg.seed + rank + 7919 * saved["step"])


def rng_state(device: torch.device) -> dict:
    """This process's generators that training draws from (dropout; the batch generator is the loop's)."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)

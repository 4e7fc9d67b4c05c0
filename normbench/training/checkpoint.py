"""Checkpoints: everything a run needs to continue exactly where it stopped.

``checkpoint.pt`` in the run directory holds the model (BatchNorm buffers included), the
optimizer, the LR schedule, the gradient scaler, the step, every RNG state that feeds
training (torch's CPU and CUDA generators, per rank, and the batch generator), the
loop's own state (losses not yet logged, timer, the losses the summary is made of) and
the length metrics.jsonl had, so a resumed run cuts the log back to that point.

It holds tensors, numbers, strings, lists and dicts only: ``torch.load(weights_only=True)``
reads it. It is written atomically, the one before it kept as ``checkpoint.prev.pt``. The file is
torch.save's zip archive, whose every record (each tensor's bytes, the pickle of the rest) carries
the CRC-32 torch.save computes as it writes; ``load`` checks them all before trusting the file, so
a file that is truncated, unreadable or altered is skipped with a warning for the previous one, or
for a fresh start, never resumed from. The checksums cost no pass of their own over the state
(a separate SHA-256 of the contents would add 1.2 s of CPU to each checkpoint at 124M parameters).
``snapshot`` copies a state to CPU memory that training no longer touches, so that writing it can
run beside training (normbench.training.checkpoint_writer).
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from normbench.core.errors import first_line
from normbench.core.fileio import atomic_file
from normbench.core.runs import CHECKPOINT, MODEL, PREVIOUS

FORMAT = 2  # 1 carried a SHA-256 of its contents; 2 relies on the archive's CRC-32s


def snapshot(value, reuse=None, copies: dict | None = None):
    """A copy of a checkpoint's state that shares nothing with the running training: every tensor copied
    to the CPU, every container rebuilt (the loop appends to its lists while a checkpoint is written).

    ``reuse``: an earlier snapshot no longer being written; its tensors of the same shape and dtype are
    copied into rather than allocated again (at 124M parameters, 1.4 GiB of fresh pages per checkpoint).
    Tensors that are views of the same memory (a head tied to the embedding) share one copy, as torch.save
    stores them once: at 124M that is 147 MiB less to copy and write.
    """
    copies = {} if copies is None else copies
    if isinstance(value, torch.Tensor):
        value = value.detach()
        key = (value.device, value.untyped_storage().data_ptr(), value.storage_offset(), value.dtype)
        key += (tuple(value.shape), value.stride())
        if key not in copies:
            if isinstance(reuse, torch.Tensor) and (reuse.shape, reuse.dtype) == (value.shape, value.dtype):
                copies[key] = reuse.copy_(value)
            else:
                copies[key] = value.to("cpu", copy=True)
        return copies[key]
    if isinstance(value, dict):
        reuse = reuse if isinstance(reuse, dict) else {}
        return {key: snapshot(item, reuse.get(key), copies) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        reuse = (
            reuse if isinstance(reuse, (list, tuple)) and len(reuse) == len(value) else [None] * len(value)
        )
        return type(value)(snapshot(item, old, copies) for item, old in zip(value, reuse))
    return value


class Discarded(Exception):
    """A checkpoint given up before it was complete: ``save``'s ``wanted()`` said it is no longer needed."""


def save(run_dir: Path, state: dict, wanted: Callable[[], bool] = lambda: True) -> int:
    """Write ``state`` as the run's checkpoint, atomically, keeping the last one; return its size in bytes.

    The file is written and synced under a temporary name first; only then is the last checkpoint
    moved to checkpoint.prev.pt and the new one renamed into place. A kill anywhere leaves the last
    complete checkpoint (or the one before it) for load(), never a torn checkpoint.pt.
    ``wanted()`` is asked before each write (``_Stream``); False raises Discarded, the temporary file
    removed and the checkpoints on disk as they were.
    """
    path = Path(run_dir) / CHECKPOINT

    def keep_previous():
        if path.exists():
            os.replace(path, Path(run_dir) / PREVIOUS)

    with atomic_file(path, keep_previous) as f:
        stream = _Stream(f, wanted)
        torch.save({**state, "format": FORMAT}, stream)
        error, stream.error = stream.error, None
        if error is not None:
            try:
                raise error  # Discarded, or the disk's OSError (DiskFull from atomic_file)
            finally:  # no frame keeps the error whose traceback holds it: the state is freed at once
                error = None
        return f.tell()  # atomic_file syncs what is left and renames the file into place


class _Stream:
    """The file torch.save writes a checkpoint through. ``wanted()`` is asked before each write (one
    record's bytes at most: 147 MiB at 124M parameters), and every SYNC_BYTES the file is synced and
    its pages dropped from the page cache. So a checkpoint given up stops writing within one record
    and one chunk's write-back, not after 1.4 GiB and its sync; the closing sync has little left; and
    the pages written are recycled rather than 1.4 GiB of fresh page cache allocated per checkpoint
    (evicting the token shards training reads): at 124M on a 2-core VM a checkpoint takes 1.6 s of
    CPU instead of 2.6 s (docs/benchmarks.md).

    A write given up or failed is kept in ``error`` and every later write dropped: torch.save runs
    to its end (the rest costs its CRC-32s, no disk), and ``save`` raises the error. Raised into
    torch.save's C++ writer instead, an error would come back as one of the archive's own, and keep
    the state being saved alive for good."""

    SYNC_BYTES = 64 * 2**20

    def __init__(self, f, wanted: Callable[[], bool]):
        self.f, self.wanted = f, wanted
        self.synced = 0  # the file's length at its last sync
        self.error: Exception | None = None

    def write(self, data) -> int:
        if self.error is None:
            try:
                self._write(data)
            except (Discarded, OSError) as err:
                self.error = err.with_traceback(None)
        return memoryview(data).nbytes

    def _write(self, data) -> None:
        if not self.wanted():
            raise Discarded
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


# ----------------------------------------------------------------------------- RNG states


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

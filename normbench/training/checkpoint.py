"""Checkpoints: everything a run needs to continue exactly where it stopped.

``checkpoint.pt`` in the run directory holds the model (BatchNorm buffers included), the
optimizer, the LR schedule, the gradient scaler, the step, every RNG state that feeds
training (torch's CPU and CUDA generators, per rank, and the batch generator), the
loop's own state (losses not yet logged, timer, the losses the summary is made of) and
the length metrics.jsonl had, so a resumed run cuts the log back to that point.

It holds tensors, numbers, strings, lists and dicts only: ``torch.load(weights_only=True)``
reads it. It is written atomically, the one before it kept as ``checkpoint.prev.pt``, and
it carries a SHA-256 of its own contents: a file that is truncated, unreadable or altered
is skipped with a warning for the previous one, or for a fresh start, never resumed from.
``snapshot`` copies a state to CPU memory that training no longer touches, so that hashing and
writing it can run beside training (normbench.training.checkpoint_writer).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from normbench.core.errors import first_line
from normbench.core.fileio import atomic_file
from normbench.core.runs import CHECKPOINT, MODEL, PREVIOUS

FORMAT = 1


def _feed(digest, value) -> None:
    """Hash a checkpoint's contents in a fixed order: every tensor byte and every number and string."""
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        digest.update(f"T{value.dtype}{tuple(value.shape)}".encode())
        if flat.numel():  # the tensor's own bytes, read in place (hashlib releases the GIL on them)
            digest.update(flat.view(torch.uint8).numpy())
    elif isinstance(value, dict):
        digest.update(f"D{len(value)}".encode())
        for key in sorted(value, key=repr):
            digest.update(repr(key).encode())
            _feed(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"L{len(value)}".encode())
        for item in value:
            _feed(digest, item)
    else:
        digest.update(f"V{value!r}".encode())


def content_hash(state: dict) -> str:
    digest = hashlib.sha256()
    _feed(digest, {k: v for k, v in state.items() if k != "sha256"})
    return digest.hexdigest()


def snapshot(value, reuse=None):
    """A copy of a checkpoint's state that shares nothing with the running training: every tensor copied
    to the CPU, every container rebuilt (the loop appends to its lists while a checkpoint is written).

    ``reuse``: an earlier snapshot no longer being written; its tensors of the same shape and dtype are
    copied into rather than allocated again (at 124M parameters, 1.4 GiB of fresh pages per checkpoint).
    """
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if isinstance(reuse, torch.Tensor) and (reuse.shape, reuse.dtype) == (value.shape, value.dtype):
            return reuse.copy_(value)
        return value.to("cpu", copy=True)
    if isinstance(value, dict):
        reuse = reuse if isinstance(reuse, dict) else {}
        return {key: snapshot(item, reuse.get(key)) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        reuse = (
            reuse if isinstance(reuse, (list, tuple)) and len(reuse) == len(value) else [None] * len(value)
        )
        return type(value)(snapshot(item, old) for item, old in zip(value, reuse))
    return value


def save(run_dir: Path, state: dict) -> int:
    """Write ``state`` as the run's checkpoint, atomically, keeping the last one; return its size in bytes.

    The file is written and synced under a temporary name first; only then is the last checkpoint
    moved to checkpoint.prev.pt and the new one renamed into place. A kill anywhere leaves the last
    complete checkpoint (or the one before it) for load(), never a torn checkpoint.pt.
    """
    state = {**state, "format": FORMAT}
    state["sha256"] = content_hash(state)
    path = Path(run_dir) / CHECKPOINT

    def keep_previous():
        if path.exists():
            os.replace(path, Path(run_dir) / PREVIOUS)

    return _write(path, state, keep_previous)


def save_weights(run_dir: Path, model: torch.nn.Module) -> int:
    """The final weights as ``model.pt`` (a state dict), for analysis after the run."""
    return _write(Path(run_dir) / MODEL, model.state_dict())


def _write(path: Path, obj, before_replace=None) -> int:
    with atomic_file(path, before_replace) as f:
        torch.save(obj, f)
        return f.tell()


def _read(path: Path) -> dict:
    """One checkpoint file, verified; raises ValueError saying what is wrong with it."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zip, garbage, a pickle of disallowed types
        raise ValueError(f"unreadable ({first_line(err)})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError("not a normbench checkpoint of this version")
    if state.get("sha256") != content_hash(state):
        raise ValueError("its contents do not match its checksum (corrupted)")
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

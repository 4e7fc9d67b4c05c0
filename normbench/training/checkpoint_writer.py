"""Checkpoints written beside training: the loop pays for a copy of its state, a thread for the rest.

``CheckpointWriter.submit`` copies a state to CPU memory (``checkpoint.snapshot``, into the buffers
of the last checkpoint once it is written) and hands the copy to one background thread, which
serializes it, writes and syncs it, and renames it into place (``checkpoint.save``): at 124M
parameters that is seconds of CPU and disk that the training thread no longer waits for. One
checkpoint is in flight at a time: a checkpoint due while the last is still being written waits for
it, so checkpoints land in order and one copy of the state is kept.
A kill -9 mid-write leaves the last complete checkpoint, which is what a resume reads.

The thread runs at the lowest CPU priority the system gives (``yield_cpu``): it writes on the
cycles training leaves (beside a GPU's kernels, between a CPU step's parallel regions) and never
delays the thread that launches the step; when the loop waits for it, it has the machine.
A run that ends needs no checkpoint more (its summary is the result, and the checkpoints are
removed): ``discard`` gives up the one in flight instead of finishing it.

A write that fails (a full disk) costs that checkpoint, not the run: the error is kept and reported
on the training thread, at the next submit or ``wait``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from normbench.core.errors import DiskFull
from normbench.training import checkpoint


class CheckpointWriter:
    """Writes a run directory's checkpoints on a background thread, one at a time."""

    def __init__(self, run_dir: Path, warn: Callable[[str], None]):
        self.run_dir, self.warn = Path(run_dir), warn
        self.written: int | None = None  # the step of the newest checkpoint complete on disk
        self._thread: threading.Thread | None = None
        self._failure: str | None = None
        self._last: dict | None = None  # the last snapshot: its tensors are the next one's buffers
        self._discarding = threading.Event()

    def submit(self, step: int, state: dict) -> None:
        """Copy ``state`` now and write the copy, beside training, as the checkpoint of ``step``."""
        self.wait()  # the last snapshot is written: its buffers are free
        self._last = copy = checkpoint.snapshot(state, self._last)
        self._thread = threading.Thread(
            target=self._write, args=(step, copy), name="normbench-checkpoint", daemon=True
        )
        self._thread.start()

    def wait(self) -> None:
        """Until the checkpoint in flight is on disk; reports a failed write through ``warn``."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._failure is not None:
            failure, self._failure = self._failure, None
            self.warn(failure)

    def discard(self) -> None:
        """Give up the checkpoint in flight (its temporary file removed) once the part of the write under
        way ends; the checkpoints complete on disk stay as they are."""
        self._discarding.set()
        try:
            self.wait()
        finally:
            self._discarding.clear()

    def _write(self, step: int, state: dict) -> None:
        yield_cpu()
        try:
            checkpoint.save(self.run_dir, state, wanted=lambda: not self._discarding.is_set())
            self.written = step
        except checkpoint.Discarded:
            pass
        except (OSError, DiskFull) as err:  # a full disk costs the checkpoint, not the run
            self._failure = f"checkpoint at step {step} not written: {err}"


def yield_cpu() -> None:
    """The calling thread runs only on CPU time nothing else wants (Linux's SCHED_IDLE; elsewhere, or where
    the system refuses it, the thread keeps its priority)."""
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # pid 0: the calling thread

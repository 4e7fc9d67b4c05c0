"""Preemption: a stop signal becomes a checkpoint at the end of the current step, then an exit.

SLURM sends SIGTERM before it preempts a job, and ``--signal=SIG@SECONDS`` sends a
signal that long before the time limit; submitit (``hydra/launcher=slurm``) asks for
SIGUSR2 and, when it arrives, requeues the job after calling its checkpoint hook.
While a run trains, ``StopSignals`` catches SIGTERM, SIGUSR1 and SIGUSR2 and only notes
them: the training loop checks at the end of each step, saves a checkpoint and stops;
``pass_on`` then hands the signal to the handler that was there before (submitit's
checkpoint-and-requeue), so the requeued job finds the checkpoint and resumes.
Ctrl-C (SIGINT) is the same stop, asked for at a terminal: the first one checkpoints at the
end of the step, a second one raises KeyboardInterrupt at once, as Python does by default
(a process started with SIGINT ignored, a shell's background job say, keeps ignoring it).
A run stopped this way exits with 128 + the signal's number (130 for Ctrl-C), the shell's
convention for a process ended by a signal; a sweep counts such a run as interrupted.
Before the loop watches, a job notes a first Ctrl-C the same way (``noting_ctrl_c``; a sweep's
workers from their start, ``note_ctrl_c``): a KeyboardInterrupt raised while a process imports or
builds can be lost inside a library (seen: one during torch._dynamo's first import surfaced as a
RecursionError, the interrupt gone), and the job would have trained on to its end unseen. A noted
Ctrl-C stops the loop at its first step; a job that has not begun does not begin.

One handler (``_note``) answers every stop signal, wherever it comes: it sets the one flag the loop
reads at step boundaries (``StopSignals.requested``), before the loop (``noted``) and during it alike.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import torch

from normbench.training import distributed

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1", "SIGUSR2") if hasattr(signal, name))
NAMES = {signal.SIGINT: "Ctrl-C"}  # how a person knows the signal, where it is not its own name
_noted: list[int] = []  # the stop signal this process noted and no training loop has answered yet


def exit_code(signum: int) -> int:
    return 128 + signum


def describe(signum: int) -> str:
    """``Ctrl-C`` for SIGINT, else the signal's name (``SIGTERM``)."""
    return NAMES.get(signum) or signal.Signals(signum).name


def note_ctrl_c() -> None:
    """From now on a first Ctrl-C in this process is noted (``noted``), not raised; a second raises
    KeyboardInterrupt. Not where SIGINT is ignored, nor off the main thread, which signals never reach."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _note)


@contextlib.contextmanager
def noting_ctrl_c() -> Iterator[None]:
    """``note_ctrl_c`` for one job; SIGINT's handler as it was afterwards."""
    previous = signal.getsignal(signal.SIGINT)
    note_ctrl_c()
    try:
        yield
    finally:
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, previous)


def noted() -> int | None:
    """The stop signal noted that no training loop has answered yet (SIGINT for a Ctrl-C), else None."""
    return _noted[0] if _noted else None


def _note(signum, frame) -> None:
    """The one handler of every stop signal: noted, for the loop to stop at the end of its step. A
    second Ctrl-C stops at once: the interrupt in place of the note."""
    if signum == signal.SIGINT and _noted == [signal.SIGINT]:
        _noted.clear()
        raise KeyboardInterrupt
    _noted[:] = [signum]


class StopSignals:
    """Notes SIGTERM/SIGUSR1/SIGUSR2 and a first SIGINT while the training loop runs (a context manager):
    ``_note`` is their handler; a Ctrl-C noted before the loop stops it at its first step. On leaving,
    the loop has answered the signal: it is this object's (``received``), no longer the process's."""

    def __init__(self):
        self.previous: dict[int, object] = {}
        self.answered: int | None = None
        self.watching = False

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for sig in SIGNALS:
                self.previous[sig] = signal.signal(sig, _note)
            if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
                self.previous[signal.SIGINT] = signal.signal(signal.SIGINT, _note)
        self.watching = True
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.watching, self.answered = False, noted()
        _noted.clear()

    @property
    def received(self) -> int | None:
        """The stop signal noted (while the loop watches), or that the loop answered (after)."""
        return noted() if self.watching else self.answered

    def requested(self, step: int, log_every: int, device: torch.device) -> bool:
        """Whether to checkpoint and stop after ``step``. Under torchrun the ranks agree first, at the
        log steps (where they synchronise anyway), so every rank stops after the same step."""
        if distributed.world_size() == 1:
            return self.received is not None
        if step % log_every:
            return False
        flag = torch.tensor([0.0 if self.received is None else float(self.received)], device=device)
        agreed = distributed.all_max(flag).item()
        if agreed and self.received is None:
            _noted[:] = [int(agreed)]  # another rank's signal: this rank answers it too
        return bool(agreed)

    def pass_on(self) -> None:
        """Give the signal to the handler that was installed before ours (submitit's requeue, say).
        Not Ctrl-C's: a person stopping the run is answered by the checkpoint and the exit."""
        if self.received == signal.SIGINT:
            return
        handler = self.previous.get(self.received)
        if callable(handler) and handler is not signal.default_int_handler:
            handler(self.received, None)

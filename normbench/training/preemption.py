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
"""

from __future__ import annotations

import signal
import threading

import torch

from normbench.training import distributed

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1", "SIGUSR2") if hasattr(signal, name))
NAMES = {signal.SIGINT: "Ctrl-C"}  # how a person knows the signal, where it is not its own name


def exit_code(signum: int) -> int:
    return 128 + signum


def describe(signum: int) -> str:
    """``Ctrl-C`` for SIGINT, else the signal's name (``SIGTERM``)."""
    return NAMES.get(signum) or signal.Signals(signum).name


class StopSignals:
    """Notes SIGTERM/SIGUSR1/SIGUSR2 and a first SIGINT while the training loop runs (a context manager)."""

    def __init__(self):
        self.received: int | None = None
        self.previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for sig in SIGNALS:
                self.previous[sig] = signal.signal(sig, self._note)
            if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
                self.previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._note)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _note(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now, without the checkpoint
        self.received = signum

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
            self.received = int(agreed)
        return bool(agreed)

    def pass_on(self) -> None:
        """Give the signal to the handler that was installed before ours (submitit's requeue, say).
        Not Ctrl-C's: a person stopping the run is answered by the checkpoint and the exit."""
        if self.received == signal.SIGINT:
            return
        handler = self.previous.get(self.received)
        if callable(handler) and handler is not signal.default_int_handler:
            handler(self.received, None)

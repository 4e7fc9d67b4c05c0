"""Preemption: a stop signal becomes a checkpoint at the end of the current step, then an exit.

SLURM sends SIGTERM before it preempts a job, and ``--signal=SIG@SECONDS`` sends a
signal that long before the time limit; submitit (``hydra/launcher=slurm``) asks for
SIGUSR2 and, when it arrives, requeues the job after calling its checkpoint hook.
While a run trains, ``StopSignals`` catches SIGTERM, SIGUSR1 and SIGUSR2 and only notes
them: the training loop checks at the end of each step, saves a checkpoint and stops;
``pass_on`` then hands the signal to the handler that was there before (submitit's
checkpoint-and-requeue), so the requeued job finds the checkpoint and resumes.
A run stopped this way exits with 128 + the signal's number, the shell's convention
for a process ended by a signal; a sweep counts such a run as interrupted.
"""

from __future__ import annotations

import signal
import threading

import torch

from normbench.training import distributed

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1", "SIGUSR2") if hasattr(signal, name))


def exit_code(signum: int) -> int:
    return 128 + signum


class StopSignals:
    """Notes SIGTERM/SIGUSR1/SIGUSR2 while the training loop runs (a context manager)."""

    def __init__(self):
        self.received: int | None = None
        self.previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for sig in SIGNALS:
                self.previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _note(self, signum, frame) -> None:
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
        """Give the signal to the handler that was installed before ours (submitit's requeue, say)."""
        handler = self.previous.get(self.received)
        if callable(handler) and handler is not signal.default_int_handler:
            handler(self.received, None)

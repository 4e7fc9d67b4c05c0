"""What checkpoints cost a run: written by the loop (synchronously) or by a thread beside it, on a quiet
machine and with busy processes on the cores.

Builds a run as ``normbench train`` does (by default GPT-2 small, 124M parameters, at a short
context so that a CPU step takes seconds), trains a step so AdamW's moments exist, then times, in
alternating rounds (the order turned each round: a shared machine's drift falls on all alike):

- bare: ``--steps`` steps without a checkpoint;
- synchronous: the same steps with ``--checkpoints`` checkpoints written by the loop, as
  ``normbench train`` writes them (``Checkpoints.save``); the saves' own time is printed too;
- thread: the same steps with the checkpoints written by a thread at normal priority from a CPU
  copy of the state, the loop waiting for the last write before the next and at the end: what a
  background writer would cost.

Each is run quiet, then with ``--busy`` processes spinning on the cores (other training jobs of a
sweep, say). A mode's cost is its median time less the bare median.

    python benchmarks/checkpoint_blocking.py [--rounds 2] [--steps 9] [--checkpoints 3] [--busy 2] \\
        [OVERRIDES...]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from normbench.core.configtree import compose
from normbench.training import checkpoint
from normbench.training.checkpoint import Checkpoints
from normbench.training.config import parse_config
from normbench.training.loop import Run

DEFAULT = ["model=gpt2", "model.block_size=64", "train.batch_size=2", "train.device=cpu"]
MODES = ("bare", "synchronous", "thread")


def state_of(run, state: Run, step: int) -> dict:
    """A checkpoint's state as the loop builds it (the loop's own history kept small)."""
    loop = {"val_losses": [1.0], "grad_norms": [1.0], "step_times": [0.1], "pending": torch.zeros(0, 2)}
    return {
        **checkpoint.capture(state),
        "step": step,
        "config_hash": run.config_hash,
        "metrics_bytes": 0,
        "loop": {**loop, "wall_s": 0.0, "resumed_at": []},
    }


def cpu_copy(value):
    """A copy sharing nothing with training, for a thread to write while the steps go on."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: cpu_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(cpu_copy(item) for item in value)
    return value


def timed(
    mode: str, run, state: Run, files: Checkpoints, steps: int, checkpoints: int
) -> tuple[float, float]:
    """(seconds for the steps with ``mode``'s checkpoints, seconds the synchronous saves took)."""
    every = max(steps // max(checkpoints, 1), 1)
    writer: threading.Thread | None = None
    saving = 0.0
    start = time.perf_counter()
    for step in range(1, steps + 1):
        state.train_step()
        if mode == "bare" or step % every or step // every > checkpoints:
            continue
        if mode == "synchronous":
            began = time.perf_counter()
            files.save(step, state_of(run, state, step))
            saving += time.perf_counter() - began
        else:
            if writer is not None:
                writer.join()
            copy = cpu_copy(state_of(run, state, step))
            writer = threading.Thread(target=files.save, args=(step, copy))
            writer.start()
    if writer is not None:
        writer.join()
    return time.perf_counter() - start, saving


@contextlib.contextmanager
def busy(processes: int):
    """``processes`` spinning Python processes at normal priority for the block's length."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for proc in spinning:
            proc.kill()
            proc.wait()


def measure(run, state: Run, files: Checkpoints, args) -> dict[str, tuple[list[float], list[float]]]:
    times = {mode: ([], []) for mode in MODES}
    for round_ in range(args.rounds):
        order = MODES if round_ % 2 == 0 else MODES[::-1]
        for mode in order:
            took, saving = timed(mode, run, state, files, args.steps, args.checkpoints)
            times[mode][0].append(took)
            times[mode][1].append(saving)
    return times


def report(load: str, times: dict[str, tuple[list[float], list[float]]], checkpoints: int) -> None:
    bare = statistics.median(times["bare"][0])
    print(f"{load}: bare {bare:.2f} s (each: {_each(times['bare'][0])})")
    for mode in ("synchronous", "thread"):
        took = times[mode][0]
        print(
            f"  {mode}: {statistics.median(took):.2f} s (each: {_each(took)}), "
            f"{checkpoints} checkpoints cost {statistics.median(took) - bare:+.2f} s"
        )
    print(f"  {checkpoints} synchronous saves alone: {statistics.median(times['synchronous'][1]):.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each mode")
    parser.add_argument("--steps", type=int, default=9, help="training steps per measurement")
    parser.add_argument("--checkpoints", type=int, default=3, help="checkpoints within the steps")
    parser.add_argument("--busy", type=int, default=2, help="spinning processes for the busy case (0: none)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    run = parse_config(compose([*DEFAULT, *args.overrides]))
    with tempfile.TemporaryDirectory() as tmp:
        state = Run(run, Path(tmp))
        state.train_step()  # AdamW's moments exist from the first step on
        files = Checkpoints(Path(tmp), warn=print)
        quiet = measure(run, state, files, args)
        if args.busy:
            with busy(args.busy):
                loaded = measure(run, state, files, args)
        size = (Path(tmp) / "checkpoint.pt").stat().st_size
    print(
        f"model: {state.model.num_params():,} parameters, batch {run.train.batch_size} x "
        f"{run.model.block_size}, torch threads {torch.get_num_threads()}; "
        f"checkpoint {size / 2**20:,.0f} MiB; "
        f"{args.steps} steps, {args.checkpoints} checkpoints, {args.rounds} rounds"
    )
    report("quiet", quiet, args.checkpoints)
    if args.busy:
        report(f"with {args.busy} busy processes", loaded, args.checkpoints)


def _each(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    main()

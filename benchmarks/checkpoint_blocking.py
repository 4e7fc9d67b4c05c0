"""What a checkpoint costs the training thread: written in the loop (synchronously) or beside it.

Builds a run as ``normbench train`` does (by default GPT-2 small, 124M parameters, at a short
context so that a CPU step takes seconds), trains a step so AdamW's moments exist, then measures:

- synchronous: the training thread gathers the state, hashes, serializes, writes and syncs it
  (``checkpoint.save`` on the live state): all of it is blocked time;
- beside training: ``CheckpointWriter.submit`` copies the state to CPU memory
  (``checkpoint.snapshot``, into the last checkpoint's buffers) and hands the copy to its thread;
  the blocked time is the copy and hand-over, while the thread writes it as training steps go on;
- the wall time of ``--steps`` training steps with three checkpoints written beside them (the
  last one waited for, as a run's end does) against the same steps without: what three
  checkpoints cost a run, the writer's competition for the CPU included.

    python benchmarks/checkpoint_blocking.py [--rounds 2] [--steps 12] [OVERRIDES...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from normbench.core.configtree import compose
from normbench.training import checkpoint
from normbench.training.checkpoint_writer import CheckpointWriter
from normbench.training.config import parse_config
from normbench.training.loop import Run

DEFAULT = ["model=gpt2", "model.block_size=64", "train.batch_size=2", "train.device=cpu"]


def state_of(run, state: Run, step: int) -> dict:
    """A checkpoint's state as the loop builds it (the loop's own history kept small)."""
    loop = {"val_losses": [1.0], "grad_norms": [1.0], "step_times": [0.1], "pending": torch.zeros(0, 2)}
    return {
        **state.checkpoint_state(),
        "step": step,
        "config_hash": run.config_hash,
        "metrics_bytes": 0,
        "loop": {**loop, "wall_s": 0.0, "resumed_at": []},
    }


def steps(state: Run, n: int, every: int | None = None, writer: CheckpointWriter | None = None, run=None):
    """Seconds for ``n`` steps, a checkpoint submitted to ``writer`` after every ``every``-th, the last
    waited for; and the training thread's blocked time per checkpoint."""
    blocked = []
    start = time.perf_counter()
    for i in range(1, n + 1):
        state.train_step()
        if every and i % every == 0:
            t = time.perf_counter()
            writer.submit(i, state_of(run, state, i))
            blocked.append(time.perf_counter() - t)
    if writer is not None:
        writer.wait()
    return time.perf_counter() - start, blocked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="synchronous checkpoints timed")
    parser.add_argument("--steps", type=int, default=12, help="steps, with and without three checkpoints")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    run = parse_config(compose([*DEFAULT, *args.overrides]))
    with tempfile.TemporaryDirectory() as tmp:
        state = Run(run, Path(tmp))
        state.train_step()  # AdamW's moments exist from the first step on
        sync_s = []
        for round_ in range(args.rounds):
            start = time.perf_counter()
            checkpoint.save(Path(tmp), state_of(run, state, round_))
            sync_s.append(time.perf_counter() - start)
        size = (Path(tmp) / checkpoint.CHECKPOINT).stat().st_size
        bare_s, _ = steps(state, args.steps)
        writer = CheckpointWriter(Path(tmp), warn=print)
        with_s, blocked = steps(state, args.steps, args.steps // 3, writer, run)
        assert checkpoint.load(Path(tmp), warn=print)["step"] == args.steps // 3 * 3
    print(
        f"model: {state.model.num_params():,} parameters, batch {run.train.batch_size} x "
        f"{run.model.block_size}, torch threads {torch.get_num_threads()}; checkpoint {size / 2**20:,.0f} MiB"
    )
    print(
        f"blocked per checkpoint, synchronous    {statistics.median(sync_s):.2f} s  (rounds: "
        f"{', '.join(f'{s:.2f}' for s in sync_s)})"
    )
    print(
        f"blocked per checkpoint, beside training {statistics.median(blocked):.2f} s  (each: "
        f"{', '.join(f'{s:.2f}' for s in blocked)})"
    )
    print(
        f"{args.steps} steps: {bare_s:.1f} s; with three checkpoints beside them {with_s:.1f} s: "
        f"{with_s - bare_s:+.1f} s for three checkpoints"
    )


if __name__ == "__main__":
    main()

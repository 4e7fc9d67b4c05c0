"""What a checkpoint costs a run: written in the loop (synchronously) or beside it.

Builds a run as ``normbench train`` does (by default GPT-2 small, 124M parameters, at a short
context so that a CPU step takes seconds), trains a step so AdamW's moments exist, then measures:

- synchronous: the training thread serializes, writes and syncs the state
  (``checkpoint.save`` on the live state): all of it is blocked time; the CPU time of it (the
  rest is waiting for the disk) is what a checkpoint written beside training takes from a machine
  whose every core trains;
- beside training: ``--steps`` steps with one checkpoint submitted before them (the copy into the
  last checkpoint's buffers, the thread writing it as the steps go on, waited for after them)
  against the same steps without, in alternating rounds (the order flipped each round: a shared
  machine's drift falls on both alike). A round's difference is what the checkpoint cost the run,
  the writer's competition for the CPU included; the median over rounds is reported;
- the end of a run: a checkpoint submitted one step before the run ends, then discarded as a
  completed run does (``CheckpointWriter.discard``): what a checkpoint in flight costs the end.

    python benchmarks/checkpoint_blocking.py [--rounds 3] [--steps 13] [OVERRIDES...]
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


def steps(state: Run, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        state.train_step()
    return time.perf_counter() - start


def beside(run, state: Run, writer: CheckpointWriter, n: int) -> tuple[float, float, float]:
    """Seconds for ``n`` steps after a checkpoint is submitted, its write waited for after them; the
    training thread's blocked time at the submit; and the wait after the steps."""
    start = time.perf_counter()
    writer.submit(n, state_of(run, state, n))
    blocked = time.perf_counter() - start
    steps(state, n)
    waited = time.perf_counter()
    writer.wait()
    return time.perf_counter() - start, blocked, time.perf_counter() - waited


def ending(run, state: Run, writer: CheckpointWriter) -> float:
    """Seconds a checkpoint submitted one step before the end adds to that step: the submit, then the
    discard a completed run makes."""
    start = time.perf_counter()
    writer.submit(0, state_of(run, state, 0))
    state.train_step()
    writer.discard()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each measurement")
    parser.add_argument("--steps", type=int, default=13, help="steps after a checkpoint, and without one")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    run = parse_config(compose([*DEFAULT, *args.overrides]))
    with tempfile.TemporaryDirectory() as tmp:
        state = Run(run, Path(tmp))
        state.train_step()  # AdamW's moments exist from the first step on
        sync_s, sync_cpu = [], []
        for round_ in range(args.rounds):
            start, cpu = time.perf_counter(), time.process_time()
            checkpoint.save(Path(tmp), state_of(run, state, round_))
            sync_s.append(time.perf_counter() - start)
            sync_cpu.append(time.process_time() - cpu)
        size = (Path(tmp) / checkpoint.CHECKPOINT).stat().st_size
        writer = CheckpointWriter(Path(tmp), warn=print)
        writer.submit(0, state_of(run, state, 0))  # the buffers every later snapshot copies into
        writer.wait()
        bare, with_, blocked, waited = [], [], [], []
        for round_ in range(args.rounds):
            for kind in ("bare", "with") if round_ % 2 == 0 else ("with", "bare"):
                if kind == "bare":
                    bare.append(steps(state, args.steps))
                else:
                    took, held, tail = beside(run, state, writer, args.steps)
                    with_.append(took)
                    blocked.append(held)
                    waited.append(tail)
        step_s = statistics.median(bare) / args.steps
        end_s = [ending(run, state, writer) - step_s for _ in range(args.rounds)]
        assert checkpoint.load(Path(tmp), warn=print)["step"] in (0, args.steps)  # the last discarded or not
    cost = [w - b for w, b in zip(with_, bare)]
    print(
        f"model: {state.model.num_params():,} parameters, batch {run.train.batch_size} x "
        f"{run.model.block_size}, torch threads {torch.get_num_threads()}; checkpoint {size / 2**20:,.0f} MiB"
    )
    print(
        f"synchronous: blocked {statistics.median(sync_s):.2f} s  (each: {_each(sync_s)}), of which CPU "
        f"{statistics.median(sync_cpu):.2f} s  (each: {_each(sync_cpu)}): what one takes from a machine "
        "with no core to spare"
    )
    print(
        f"beside training: blocked {statistics.median(blocked):.2f} s at the submit; {args.steps} steps "
        f"{statistics.median(bare):.1f} s without (each: {_each(bare)}), with one checkpoint "
        f"{statistics.median(with_):.1f} s (each: {_each(with_)})"
    )
    print(
        f"a checkpoint costs the run {statistics.median(cost):+.2f} s  (each round: {_each(cost)}; the write "
        f"still going after the steps, waited for: {_each(waited)} s)"
    )
    print(
        f"a checkpoint in flight at the run's end costs it {statistics.median(end_s):+.2f} s  "
        f"(each: {_each(end_s)})"
    )


def _each(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    main()

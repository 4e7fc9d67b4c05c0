"""What checkpoints cost: one checkpoint's time and size against the training it interrupts.

Builds a run exactly as ``normbench train`` does (the default config unless overrides
are given), trains a few steps so AdamW's moments exist, then alternates, round after
round, a block of training steps and one checkpoint written the way the loop writes it
(normbench.training.checkpoint.save: gather the states, checksum, serialise, write atomically,
keep the previous one). Interleaving makes machine noise hit both alike. Prints the
checkpoint's size, the median step and checkpoint times, loading and verifying one,
and the overhead at the given cadence: checkpoint time / (cadence x step time).

    python benchmarks/checkpoint_cost.py [--rounds 5] [--block 10] [OVERRIDES...]
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
from normbench.training.config import parse_config
from normbench.training.loop import Run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block", type=int, default=10, help="training steps timed per round")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = compose(["train.device=cpu", *args.overrides])
    run = parse_config(cfg)
    cadence = run.train.checkpoint_every  # None: by wall time, train.checkpoint_minutes
    with tempfile.TemporaryDirectory() as tmp:
        state = Run(run, Path(tmp))
        for _ in range(3):  # AdamW's moments exist from the first step on
            state.train_step()
        step_s, save_s, size = [], [], 0
        for round_ in range(args.rounds):
            start = time.perf_counter()
            for _ in range(args.block):
                state.train_step()
            step_s.append((time.perf_counter() - start) / args.block)
            start = time.perf_counter()
            loop = {
                "val_losses": [1.0],
                "grad_norms": [1.0] * 100,
                "step_times": [0.1] * 100,
                "pending": torch.zeros(0, 2),
                "wall_s": 0.0,
                "resumed_at": [],
            }
            size = checkpoint.save(
                Path(tmp),
                {
                    **checkpoint.capture(state),
                    "step": round_,
                    "config_hash": run.config_hash,
                    "metrics_bytes": 0,
                    "loop": loop,
                },
            )
            save_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        assert checkpoint.load(Path(tmp), warn=print) is not None
        load_s = time.perf_counter() - start
    step, save = statistics.median(step_s), statistics.median(save_s)
    print(
        f"model: {state.model.num_params():,} parameters ({run.model.n_layer} layers, width "
        f"{run.model.d_model}), "
        f"batch {run.train.batch_size}, torch threads {torch.get_num_threads()}"
    )
    print(f"checkpoint size        {size / 2**20:.2f} MiB")
    print(
        f"step time (median)     {1000 * step:.1f} ms   (rounds: "
        f"{', '.join(f'{1000 * s:.0f}' for s in step_s)})"
    )
    print(
        f"checkpoint write       {1000 * save:.1f} ms   (rounds: "
        f"{', '.join(f'{1000 * s:.0f}' for s in save_s)})"
    )
    print(f"load + verify          {1000 * load_s:.1f} ms")
    if cadence:
        print(
            f"every {cadence} steps: {100 * save / (cadence * step):.2f}% of training time "
            f"({save / step:.1f} steps' worth per checkpoint)"
        )
    else:
        minutes = run.train.checkpoint_minutes
        print(
            f"every {minutes:g} minutes: {100 * save / (60 * minutes):.2f}% of the wall time, "
            "written in the loop"
        )


if __name__ == "__main__":
    main()

"""Training throughput per norm: tokens/s of every norm's model, and its ratio to LayerNorm's, in one run.

One process holds one model per norm (same size, data, optimizer, seed), built by
normbench's own ``Run``; their training steps (``Run.train_step``, no statistics) take
turns in blocks, in a fresh order each round, so a slow spell on a shared machine hits
every norm alike. A size is a list of Hydra overrides; two are built in:

  default   the default config (model=mini: 4 layers, 128 wide, block 64; batch 32)
  nanogpt   nanoGPT's CPU example size (4 layers, 128 wide, block 64, batch 12)
  small     model=small (6 layers, 384 wide, block 256; batch 32): a GPU size

On the CPU with one thread (the default) a step's time is this thread's CPU time, which
leaves out the time other processes held the core; on CUDA each block ends with a
synchronize and is timed by the wall clock. Prints per size and norm the median tokens/s over rounds and the
per-round ratio to ln (median and quartiles). Usage:

    python benchmarks/norm_throughput.py [--sizes default,nanogpt] [--norms ln,rms,scale,dyt,bn,gn]
                                         [--rounds 20] [--block 3] [--threads 1]
                                         [--device cpu|cuda] [--precision fp32|bf16|fp16]
                                         [OVERRIDE ...]   (more Hydra overrides, e.g. train.compile=true)
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from normbench.core.configtree import compose
from normbench.training.config import parse_config
from normbench.training.loop import Run

SIZES = {
    "default": [],
    "nanogpt": ["model=mini", "train.batch_size=12"],
    "small": ["model=small"],
}


def per_round_seconds(
    steps: dict, rounds: int, block: int, clock=time.perf_counter, warmup_rounds: int = 2
) -> dict[str, list[float]]:
    """Mean seconds per step of each fn in each round; blocks in a fresh shuffled order per round."""
    order, rng = list(steps), random.Random(0)
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(warmup_rounds + rounds):
        rng.shuffle(order)
        for name in order:
            start = clock()
            for _ in range(block):
                steps[name]()
            if r >= warmup_rounds:
                seconds[name].append((clock() - start) / block)
    return seconds


def measure(
    size: list[str],
    norms: list[str],
    rounds: int,
    block: int,
    tmp: Path,
    device: str = "cpu",
    precision: str = "fp32",
    overrides: tuple[str, ...] = (),
):
    """(tokens per step, norm -> per-round seconds per step) for one size."""
    runs = {}
    for name in norms:
        cfg = compose(
            [
                *size,
                f"norm={name}",
                f"train.device={device}",
                f"train.precision={precision}",
                "train.progress=false",
                *overrides,
            ],
        )
        runs[name] = Run(parse_config(cfg), tmp / name)
    first = next(iter(runs.values())).cfg
    tokens = first.train.batch_size * first.model.block_size
    steps = {name: (lambda run=run: run.train_step(None)) for name, run in runs.items()}
    # With one thread every kernel runs on this thread: its CPU time leaves out the time other
    # processes held the core (as `normbench bench` does); with more, wall time.
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    if device.startswith("cuda"):

        def clock():  # kernels are asynchronous: a block ends when the GPU is done
            torch.cuda.synchronize()
            return time.perf_counter()

    return tokens, per_round_seconds(steps, rounds, block, clock)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="default,nanogpt", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--norms", default="ln,rms,scale,dyt,bn,gn")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--block", type=int, default=3, help="steps per block")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1: no oversubscription on a shared VM)"
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument(
        "--precision", default="fp32", help="train.precision: fp32, bf16 or fp16 (half: CUDA only)"
    )
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides for every model")
    args = parser.parse_args()
    sizes, norms = args.sizes.split(","), args.norms.split(",")
    if "ln" not in norms:
        raise SystemExit("norm_throughput.py: --norms must include ln, the reference")
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise SystemExit(
            f"norm_throughput.py: unknown size {', '.join(unknown)}; allowed: {', '.join(SIZES)}"
        )
    torch.set_num_threads(args.threads)
    console = Console()
    table = Table(
        title=f"training tokens/s per norm, {args.rounds} rounds x {args.block} steps, "
        f"{args.device}, {args.precision}, {' '.join(args.overrides)}{', ' if args.overrides else ''}"
        f"{args.threads} thread(s), blocks interleaved in one process"
    )
    for col in ("size", "norm", "tokens/s (median)", "vs ln (median of rounds)", "vs ln quartiles"):
        table.add_column(col, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            tokens, seconds = measure(
                SIZES[size],
                norms,
                args.rounds,
                args.block,
                Path(tmp) / size,
                args.device,
                args.precision,
                tuple(args.overrides),
            )
            for name, s in seconds.items():
                ratios = sorted(ln / mine for ln, mine in zip(seconds["ln"], s))  # throughput ratio per round
                q = statistics.quantiles(ratios, n=4)
                table.add_row(
                    size,
                    name,
                    f"{tokens / statistics.median(s):,.0f}",
                    f"{statistics.median(ratios):.3f}",
                    f"{q[0]:.3f} to {q[2]:.3f}",
                )
    console.print(table)


if __name__ == "__main__":
    main()

"""Seeds as one batched model against the same seeds trained one after another.

For each model size and each K, K runs of one config (seeds 0..K-1) are trained twice: one after
another with ``train()`` (what a sweep does without --batch-seeds, in one warm process) and together
with ``normbench.training.batched.train_batched``. Each side's wall time counts everything a run
does (building data and model, training, evaluation, the summary); the two alternate over the
rounds so that a shared machine's drift hits both alike, and the table shows the median of the
rounds. Usage:

    python benchmarks/batched_seeds.py [--rounds 2] [--steps 40] [--models micro,mini] [--ks 2,4,8]
        [--kernels] [OVERRIDES...]

``--kernels`` also times each side under PyTorch's profiler and adds the seconds spent inside ATen's
kernels (the self time of every ``aten::`` op, summed): what batching cannot remove, since K seeds'
arithmetic batched is the same arithmetic. Its ratio bounds from below what batching can reach on a
machine where the step is arithmetic.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from torch.profiler import ProfilerActivity, profile

from normbench.core.configtree import compose
from normbench.training.batched import train_batched
from normbench.training.config import parse_config
from normbench.training.loop import train, warm_up


def runs_of(model: str, k: int, steps: int, overrides: list[str], batched: bool) -> list:
    return [
        parse_config(
            compose(
                [
                    f"model={model}",
                    f"seed={seed}",
                    f"train.steps={steps}",
                    f"train.eval_every={steps}",
                    "train.progress=false",
                    "train.device=cpu",
                    f"train.batched={str(batched).lower()}",
                    *overrides,
                ],
            )
        )
        for seed in range(k)
    ]


def kernel_seconds(model: str, k: int, steps: int, overrides: list[str], batched: bool, out: Path) -> float:
    """Seconds inside ATen's kernels while the K runs train (one side, under the profiler)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        timed(model, k, steps, overrides, batched, out)
    micros = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key.startswith("aten::"))
    return micros / 1e6


def timed(model: str, k: int, steps: int, overrides: list[str], batched: bool, out: Path) -> float:
    runs = runs_of(model, k, steps, overrides, batched)
    dirs = [out / f"{model}-{k}-{'b' if batched else 's'}{run.seed}-{time.perf_counter_ns()}" for run in runs]
    start = time.perf_counter()
    if batched:
        summaries = train_batched(runs, dirs)
    else:
        summaries = [train(run, d) for run, d in zip(runs, dirs)]
    seconds = time.perf_counter() - start
    assert all(s["status"] == "completed" for s in summaries), [s["status"] for s in summaries]
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--models", default="micro,mini")
    parser.add_argument("--ks", default="2,4,8")
    parser.add_argument("--kernels", action="store_true", help="also the seconds inside ATen's kernels")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (default: train.threads=1)")
    args = parser.parse_args()
    overrides = args.overrides or ["train.threads=1"]
    warm_up(1)
    table = Table(title=f"{args.steps} steps per seed, {' '.join(overrides)}; median of {args.rounds} rounds")
    columns = ["model", "K", "sequential s", "batched s", "batched / sequential"]
    if args.kernels:
        columns += ["kernels: sequential s", "batched s", "batched / sequential"]
    for column in columns:
        table.add_column(column, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for model in args.models.split(","):
            timed(model, 1, 5, overrides, True, out)  # each side's first run in the process pays once
            timed(model, 1, 5, overrides, False, out)
            for k in map(int, args.ks.split(",")):
                times: dict[bool, list[float]] = {False: [], True: []}
                for r in range(args.rounds):
                    for batched in (r % 2 == 1, r % 2 == 0):  # alternate which side goes first
                        times[batched].append(timed(model, k, args.steps, overrides, batched, out))
                seq, bat = statistics.median(times[False]), statistics.median(times[True])
                row = [model, str(k), f"{seq:.2f}", f"{bat:.2f}", f"{bat / seq:.2f}x"]
                if args.kernels:
                    kseq, kbat = (
                        kernel_seconds(model, k, args.steps, overrides, side, out) for side in (False, True)
                    )
                    row += [f"{kseq:.2f}", f"{kbat:.2f}", f"{kbat / kseq:.2f}x"]
                table.add_row(*row)
                Console().print(f"{model} K={k}: sequential {times[False]}, batched {times[True]}")
    Console().print(table)


if __name__ == "__main__":
    main()

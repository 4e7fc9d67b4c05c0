"""Training throughput: normbench's loop against a minimal hand-written PyTorch loop.

Same model, data, batch and optimizer. Three variants, interleaved over several
rounds so that machine noise hits all of them alike, each reporting its mean
per-step time over the steady state (the first 10 steps left out). The mean, not
the median: a statistics step every 50 is an outlier a median would hide.

  bare        forward, backward, clip, AdamW step, zero_grad: nothing else
  normbench   normbench.train.train() with statistics at the default cadence
  no-stats    normbench.train.train() with train.stats_every=0

Prints tokens/s for each and the ratios (normbench / bare: the loop's overhead;
normbench / no-stats: what the statistics cost). The order of the three rotates
from round to round. A second, finer comparison alternates single steps: blocks
of 5 steps of normbench's ``Run.train_step`` and of the bare step, taking turns
in one process, which cancels the drift a shared machine shows over minutes. Usage:

    python benchmarks/train_throughput.py [--rounds 3] [--steps 150] [OVERRIDES...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from rich.console import Console
from rich.table import Table

from normbench.config import conf_dir, parse_config
from normbench.data import build_dataset
from normbench.model import GPT
from normbench.runs import RunDir
from normbench.train import Run, build_optimizer, train


def bare_loop(run, steps: int, warmup: int) -> float:
    """The minimal loop a person would write by hand; returns median seconds per step."""
    torch.manual_seed(run.seed)
    data = build_dataset(run.data, run.model.block_size, run.train.eval_batches * run.train.batch_size)
    model = GPT(run.model, data.vocab_size, run.norm, run.placement)
    optimizer = build_optimizer(model, run.train, torch.device("cpu"))
    gen = torch.Generator().manual_seed(run.seed)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        x, y = data.train_batch(run.train.batch_size, gen)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), run.train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return statistics.fmean(times[warmup:])


def interleaved_steps(run, rounds: int = 12, block: int = 5) -> dict[str, float]:
    """Mean seconds per step of normbench's train_step and of the bare step, in alternating blocks."""
    with tempfile.TemporaryDirectory() as tmp:
        state = Run(run, Path(tmp))
        torch.manual_seed(run.seed)
        model = GPT(run.model, state.data.vocab_size, run.norm, run.placement)
        optimizer = build_optimizer(model, run.train, torch.device("cpu"))
        gen = torch.Generator().manual_seed(run.seed)

        def bare_step():
            x, y = state.data.train_batch(run.train.batch_size, gen)
            model(x, y)[1].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), run.train.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        steps = {"bare": bare_step, "normbench": lambda: state.train_step(None)}
        times: dict[str, list[float]] = {name: [] for name in steps}
        for r in range(rounds):
            for name in (list(steps) if r % 2 else list(steps)[::-1]):
                for _ in range(block):
                    start = time.perf_counter()
                    steps[name]()
                    times[name].append(time.perf_counter() - start)
        return {name: statistics.fmean(t[2 * block:]) for name, t in times.items()}


def normbench_loop(run, tmp: Path, warmup: int) -> float:
    """Mean seconds per step after warm-up, from the run's own log (windows of log_every steps)."""
    train(run, tmp, console=Console(quiet=True))
    windows = [r for r in RunDir(tmp).read_metrics() if r["kind"] == "train" and r["step"] > warmup]
    steps = [b["step"] - a["step"] for a, b in zip(windows, windows[1:])]
    return sum(n * w["step_ms"] for n, w in zip(steps, windows[1:])) / sum(steps) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for the model/data/train config")
    args = parser.parse_args()
    base = [f"train.steps={args.steps}", "train.progress=false", "train.device=cpu", "train.eval_every=100000", *args.overrides]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        runs = {
            "normbench": parse_config(compose("config", base)),
            "no-stats": parse_config(compose("config", [*base, "train.stats_every=0"])),
        }
    bare_run = runs["normbench"]
    warmup = min(10, args.steps // 5)
    seconds: dict[str, list[float]] = {"bare": [], "normbench": [], "no-stats": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ["bare", *runs]
            for name in order[r % 3:] + order[: r % 3]:  # rotate, so no variant always runs first
                if name == "bare":
                    seconds["bare"].append(bare_loop(bare_run, args.steps, warmup))
                else:
                    seconds[name].append(normbench_loop(runs[name], Path(tmp) / f"{name}-{r}", warmup))
    tokens = bare_run.train.batch_size * bare_run.model.block_size
    tps = {name: tokens / statistics.median(s) for name, s in seconds.items()}
    table = Table(title=f"training throughput, {args.rounds} rounds x {args.steps} steps, {torch.get_num_threads()} threads")
    for col in ("loop", "tokens/s (median of rounds)", "vs bare"):
        table.add_column(col, justify="right")
    for name, value in tps.items():
        table.add_row(name, f"{value:,.0f}", f"{value / tps['bare']:.3f}")
    console = Console()
    console.print(table)
    console.print(f"statistics cost at the default cadence: {100 * (1 - tps['normbench'] / tps['no-stats']):+.1f}% of throughput")
    step = interleaved_steps(bare_run)
    console.print(f"alternating blocks of single steps: bare {1000 * step['bare']:.1f} ms, normbench train_step "
                  f"{1000 * step['normbench']:.1f} ms per step (normbench / bare throughput "
                  f"{step['bare'] / step['normbench']:.3f})")


if __name__ == "__main__":
    main()

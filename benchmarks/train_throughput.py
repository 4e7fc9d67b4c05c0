"""Training throughput: normbench's loop against a minimal hand-written PyTorch loop.

Same model, data, batch and optimizer. Three variants, interleaved over several
rounds so that machine noise hits all of them alike, each reporting its mean
per-step time over the steady state (the first 10 steps left out). The mean, not
the median: a statistics step every 50 is an outlier a median would hide.

  bare        forward, backward, clip, learning rate, AdamW step, zero_grad: nothing else
  normbench   normbench.training.loop.train() with statistics at the default cadence
  no-stats    normbench.training.loop.train() with train.stats_every=0

Prints tokens/s for each and the ratios (normbench / bare: the loop's overhead;
normbench / no-stats: what the statistics cost). The order of the three rotates
from round to round. A second, finer comparison alternates blocks of 5 steps
of normbench's ``Run.train_step`` (statistics at the default cadence) and of the
bare step, taking turns in one process, which cancels the drift a shared machine
shows over minutes; it prints the ratio and its spread over the rounds. Usage:

    python benchmarks/train_throughput.py [--rounds 3] [--steps 150] [--statistics-only] [OVERRIDES...]

``--statistics-only`` prints the price of one statistics step and nothing else (a minute
where the whole comparison takes several).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from normbench.core.configtree import compose
from normbench.core.runs import RunDir
from normbench.data.corpus import build_dataset
from normbench.model.gpt import GPT
from normbench.training.config import parse_config
from normbench.training.diagnostics import LayerStats
from normbench.training.loop import Run, train
from normbench.training.optim import build_optimizer, lr_factor


def set_lr(optimizer: torch.optim.Optimizer, cfg, step: int) -> None:
    """The learning-rate schedule set by hand, as nanoGPT does: the same values as normbench's
    scheduler, so both loops follow the same training trajectory (values, not just shapes)."""
    for group in optimizer.param_groups:
        group["lr"] = cfg.lr * lr_factor(step, cfg)


def bare_loop(run, steps: int, warmup: int) -> float:
    """The minimal loop a person would write by hand; returns median seconds per step."""
    torch.manual_seed(run.seed)
    data = build_dataset(run.data, run.model.block_size, run.train.eval_batches * run.train.batch_size)
    model = GPT(run.model, data.vocab_size, run.norm, run.placement)
    optimizer = build_optimizer(model, run.train, torch.device("cpu"))
    gen = torch.Generator().manual_seed(run.seed)
    times = []
    for step in range(steps):
        start = time.perf_counter()
        x, y = data.train_batch(run.train.batch_size, gen)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), run.train.grad_clip)
        set_lr(optimizer, run.train, step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return statistics.fmean(times[warmup:])


@contextlib.contextmanager
def paired_steps(run):
    """normbench's step and the bare step, each on its own model, ready to take turns.

    normbench's side is ``Run.train_step`` with the statistics at the run's cadence
    (``train.stats_every``), as ``train()`` calls it; ``plain`` is its step without them.
    Yields (name -> step fn, name -> model).
    """
    with tempfile.TemporaryDirectory() as tmp:
        state = Run(run, Path(tmp))
        every = run.train.stats_every
        stats = LayerStats(state.model) if every else None
        torch.manual_seed(run.seed)
        model = GPT(run.model, state.data.vocab_size, run.norm, run.placement)
        optimizer = build_optimizer(model, run.train, torch.device("cpu"))
        gen = torch.Generator().manual_seed(run.seed)
        taken = {"bare": itertools.count(), "normbench": itertools.count()}

        def bare_step():
            x, y = state.data.train_batch(run.train.batch_size, gen)
            model(x, y)[1].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), run.train.grad_clip)
            set_lr(optimizer, run.train, next(taken["bare"]))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        def normbench_step():
            step = next(taken["normbench"])
            collect = stats is not None and step % every == 0
            _, grad_norm = state.train_step(stats if collect else None)
            if collect:
                stats.record(step, grad_norm, run.train.grad_clip)

        def statistics_step():  # every step a statistics step, to price one
            _, grad_norm = state.train_step(stats)
            stats.record(0, grad_norm, run.train.grad_clip)

        steps = {
            "bare": bare_step,
            "normbench": normbench_step,
            "plain": lambda: state.train_step(None),
            **({"statistics": statistics_step} if stats else {}),
        }
        yield steps, {"bare": model, "normbench": state.model}


def alternate(steps: dict, rounds: int = 30, block: int = 5) -> dict[str, list[float]]:
    """Mean seconds per step of each fn per round, blocks taking turns; two warm-up rounds left out."""
    per_round: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(rounds + 2):
        for name in list(steps) if r % 2 else list(steps)[::-1]:
            start = time.perf_counter()
            for _ in range(block):
                steps[name]()
            if r >= 2:
                per_round[name].append((time.perf_counter() - start) / block)
    return per_round


def aten_ops(step, count: int = 10) -> collections.Counter:
    """How many times each ATen op runs in ``count`` steps (torch.profiler): a noise-free comparison."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(count):
            step()
    return collections.Counter({e.key: e.count for e in prof.key_averages() if e.key.startswith("aten::")})


def normbench_loop(run, tmp: Path, warmup: int) -> float:
    """Mean seconds per step after warm-up, from the run's own log (windows of log_every steps)."""
    train(run, tmp, console=Console(quiet=True))
    windows = [r for r in RunDir(tmp).read_metrics() if r["kind"] == "train" and r["step"] > warmup]
    steps = [b["step"] - a["step"] for a, b in itertools.pairwise(windows)]
    return sum(n * w["step_ms"] for n, w in zip(steps, windows[1:])) / sum(steps) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--statistics-only", action="store_true", help="only price a statistics step")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for the model/data/train config")
    args = parser.parse_args()
    base = [
        f"train.steps={args.steps}",
        "train.progress=false",
        "train.device=cpu",
        "train.eval_every=100000",
        *args.overrides,
    ]
    runs = {
        "normbench": parse_config(compose(base)),
        "no-stats": parse_config(compose([*base, "train.stats_every=0"])),
    }
    bare_run = runs["normbench"]
    if bare_run.train.device != "cpu":
        # The bare loop is written for the CPU (no device moves, no synchronised timing).
        raise SystemExit(
            f"train_throughput.py: compares the loops on the CPU only, got train.device="
            f"{bare_run.train.device}. On a GPU: normbench train train.device=cuda (tokens/s, MFU) "
            "and normbench bench --device cuda."
        )
    console = Console()
    if args.statistics_only:
        with paired_steps(bare_run) as (steps, _):
            price_statistics(console, steps, bare_run.train.stats_every)
        return
    warmup = min(10, args.steps // 5)
    seconds: dict[str, list[float]] = {"bare": [], "normbench": [], "no-stats": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ["bare", *runs]
            for name in order[r % 3 :] + order[: r % 3]:  # rotate, so no variant always runs first
                if name == "bare":
                    seconds["bare"].append(bare_loop(bare_run, args.steps, warmup))
                else:
                    seconds[name].append(normbench_loop(runs[name], Path(tmp) / f"{name}-{r}", warmup))
    tokens = bare_run.train.batch_size * bare_run.model.block_size
    tps = {name: tokens / statistics.median(s) for name, s in seconds.items()}
    table = Table(
        title=(
            f"training throughput, {args.rounds} rounds x {args.steps} steps, {torch.get_num_threads()} "
            "threads"
        )
    )
    for col in ("loop", "tokens/s (median of rounds)", "vs bare"):
        table.add_column(col, justify="right")
    for name, value in tps.items():
        table.add_row(name, f"{value:,.0f}", f"{value / tps['bare']:.3f}")
    console.print(table)
    console.print(
        f"statistics cost at the default cadence: {100 * (1 - tps['normbench'] / tps['no-stats']):+.1f}% of "
        "throughput"
    )
    with paired_steps(bare_run) as (steps, _):
        rounds = alternate({name: steps[name] for name in ("bare", "normbench")})
        ops = {name: aten_ops(steps[name]) for name in ("bare", "plain")}
        price_statistics(console, steps, bare_run.train.stats_every)
    bare, nb = (statistics.fmean(rounds[name]) for name in ("bare", "normbench"))
    ratios = sorted(b / n for b, n in zip(rounds["bare"], rounds["normbench"]))
    quartiles = statistics.quantiles(ratios, n=4)
    console.print(
        f"alternating blocks of 5 steps, {len(ratios)} rounds: bare {1000 * bare:.1f} ms, normbench "
        f"{1000 * nb:.1f} ms per step; normbench / bare throughput {bare / nb:.3f} "
        f"(per round: median {statistics.median(ratios):.3f}, quartiles {quartiles[0]:.3f} to "
        f"{quartiles[2]:.3f})"
    )
    extra = ops["plain"] - ops["bare"]
    missing = ops["bare"] - ops["plain"]
    console.print(
        f"ATen ops in 10 steps (torch.profiler): bare {sum(ops['bare'].values()):,}, normbench "
        f"{sum(ops['plain'].values()):,}; normbench's extra: {dict(extra) or 'none'}; "
        f"bare's extra: {dict(missing) or 'none'}"
    )


def price_statistics(console: Console, steps: dict, every: int) -> None:
    """Statistics steps and plain steps taking turns: what one statistics step costs, and its share at the
    cadence."""
    if "statistics" not in steps:
        return
    priced = alternate({name: steps[name] for name in ("plain", "statistics")}, rounds=10, block=2)
    plain, with_stats = (statistics.fmean(priced[name]) for name in ("plain", "statistics"))
    extra = sorted(s - p for s, p in zip(priced["statistics"], priced["plain"]))
    console.print(
        f"a statistics step takes {1000 * (with_stats - plain):.1f} ms more than a plain one "
        f"({1000 * plain:.1f} ms; per round: median {1000 * statistics.median(extra):.1f} ms): "
        f"{100 * (with_stats - plain) / (every * plain):.2f}% of throughput at train.stats_every={every}"
    )


if __name__ == "__main__":
    main()

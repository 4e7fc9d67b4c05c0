"""A statistics step's memory against a plain step's, compiled and eager, at one batch.

Builds a run as ``normbench train`` does (by default GPT-2 small at a short context, compiled),
trains a step so AdamW's moments exist, then times and measures a plain step and a statistics step
(``train.stats_every``'s: the per-layer records' hooks, the attention and output logits' statistics)
in turn: each step's peak memory (CUDA: the allocator's peak; CPU: the resident set's high-water
mark, both reset as the step starts, ``PeakMemory``), what it adds to what was in use before it, and
the tensors autograd kept for its backward. The same again with ``train.compile=false``: what an eager
step holds, the statistics step of a run that trains eagerly. A batch that trains compiled fails at
its first statistics step if that step needs much more than the steps between.

    python benchmarks/statistics_memory.py [--rounds 2] [OVERRIDES...]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path

import torch

from normbench.core.configtree import compose
from normbench.training.config import parse_config
from normbench.training.diagnostics import LayerStats
from normbench.training.loop import Run
from normbench.training.perf import PeakMemory

DEFAULT = ["model=gpt2", "model.block_size=256", "train.batch_size=4"]


def measured_step(state: Run, stats: LayerStats | None) -> dict:
    """One training step: seconds, peak MB, MB above the step's start, and MB kept for the backward."""
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    memory = PeakMemory(state.device)
    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        state.train_step(stats)
    if state.device.type == "cuda":
        torch.cuda.synchronize(state.device)
    seconds = time.perf_counter() - start
    if stats is not None:
        stats.record(0, torch.tensor(0.0), 0.0)  # the statistics read back, as the loop does
    peak = memory.peak_mb()
    return {"s": seconds, "peak": peak, "above": peak - memory.start_mb, "saved": sum(saved) / 2**20}


def measure(overrides: list[str], rounds: int) -> tuple[Run, dict[str, list[dict]]]:
    run = parse_config(compose(overrides))
    with tempfile.TemporaryDirectory() as tmp:
        state = Run(run, Path(tmp))
        stats = LayerStats(state.model)
        state.train_step()
        steps: dict[str, list[dict]] = {"plain": [], "statistics": []}
        for _ in range(rounds):
            steps["plain"].append(measured_step(state, None))
            steps["statistics"].append(measured_step(state, stats))
    return state, steps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2, help="plain and statistics steps measured, in turn")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    overrides = [*DEFAULT, *args.overrides]
    rows = []
    for compile_ in ("auto", "false"):
        state, steps = measure([*overrides, f"train.compile={compile_}"], args.rounds)
        label = "compiled" if state.compiled else "eager"
        if compile_ == "auto" and not state.compiled:
            print(f"torch.compile is not usable here ({state.compile_error}): eager twice")
        for kind, measured in steps.items():
            rows.append((label, kind, {k: statistics.median(m[k] for m in measured) for k in measured[0]}))
        tcfg, model, device, memory_kind = state.tcfg, state.model, state.device, state.memory.kind
        del state, steps
        gc.collect()
    micro = tcfg.micro_batch_size or tcfg.batch_size
    print(
        f"model: {model.num_params():,} parameters, batch {tcfg.batch_size} x {model.cfg.block_size} in "
        f"micro-batches of {micro}, {tcfg.precision}, on {device}; memory: {memory_kind}; "
        f"median of {args.rounds}"
    )
    header = f"{'training':<9} {'step':<11} {'s':>7} {'peak MB':>9} {'above start':>12}"
    print(f"{header} {'kept for backward':>18}")
    for label, kind, m in rows:
        print(
            f"{label:<9} {kind:<11} {m['s']:>7.2f} {m['peak']:>9,.0f} {m['above']:>12,.0f} "
            f"{m['saved']:>15,.0f} MB"
        )
    first = {(label, kind): m for label, kind, m in rows}
    if ("compiled", "plain") in first:
        plain = first["compiled", "plain"]
        for key in (("compiled", "statistics"), ("eager", "statistics")):
            print(
                f"{' '.join(key)} step / compiled plain step: peak {first[key]['peak'] / plain['peak']:.3f}, "
                f"above start {first[key]['above'] / plain['above']:.3f}"
            )


if __name__ == "__main__":
    main()

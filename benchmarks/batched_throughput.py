"""Training throughput of K seeds batched into one model, against one run alone, on one device.

For each K, seeds 0..K-1 of one config train together (``train_batched``); the table shows the
group's tokens/s (every seed's tokens), its ratio to K = 1, the group's MFU (model FLOPs of all
seeds over the device's measured matmul peak), the median step time and the peak memory. A
sequential run (``train``, the same config, seed 0) gives the row "alone": the batched code's own
cost at K = 1 is the gap between the two, in the config's precision (fp32 or bf16).

``--attention`` adds the causal attention's two forms under vmap at the model's shapes: written
out in plain ops (what the batched model runs) and ``scaled_dot_product_attention`` vmapped
directly, forward and backward, in ms per call, in the precision's dtype. Usage:

    python benchmarks/batched_throughput.py [--device cuda] [--model small] [--ks 1,4,16]
        [--steps 60] [--attention] [OVERRIDES...]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from torch.func import vmap
from torch.nn import functional as F

from normbench.core.configtree import compose
from normbench.core.devices import PRECISIONS, synchronize
from normbench.training.batched import BatchedOps, train_batched
from normbench.training.config import parse_config
from normbench.training.loop import train


def runs_of(k: int, args, overrides: list[str], batched: bool) -> list:
    return [
        parse_config(
            compose(
                [
                    f"model={args.model}",
                    f"seed={seed}",
                    f"train.steps={args.steps}",
                    f"train.eval_every={args.steps}",
                    f"train.log_every={max(1, args.steps // 4)}",
                    "train.stats_every=0",
                    "train.checkpoint_every=0",
                    "train.progress=false",
                    f"train.device={args.device}",
                    f"train.batched={str(batched).lower()}",
                    *overrides,
                ],
            )
        )
        for seed in range(k)
    ]


def attention_ms(device: str, dtype: torch.dtype, k: int, *shape: int) -> dict[str, float | str]:
    """ms per forward+backward of K seeds' causal attention, in each form, under vmap."""
    q, kk, v = (torch.randn(k, *shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))

    def written(q, kk, v):
        with BatchedOps():
            return F.scaled_dot_product_attention(q, kk, v, is_causal=True)

    def native(q, kk, v):
        return F.scaled_dot_product_attention(q, kk, v, is_causal=True)

    out = {}
    for name, fn in (("written out", written), ("vmap(sdpa)", native)):
        try:
            call = vmap(fn)
            for _ in range(3):
                call(q, kk, v).sum().backward()
            synchronize(torch.device(device))
            start, n = time.perf_counter(), 10
            for _ in range(n):
                call(q, kk, v).sum().backward()
            synchronize(torch.device(device))
            out[name] = 1000 * (time.perf_counter() - start) / n
        except Exception as err:  # a form vmap cannot run is a result, shown as such
            out[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:80]}"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="small")
    parser.add_argument("--ks", default="1,4,16")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--attention", action="store_true")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides")
    args = parser.parse_args()
    console = Console()
    title = f"model={args.model} on {args.device}, {args.steps} steps {' '.join(args.overrides)}"
    table = Table(title=title)
    for column in ("seeds", "tokens/s", "x K=1", "MFU", "step ms", "peak MB"):
        table.add_column(column, justify="right")
    base = None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        alone = train(runs_of(1, args, args.overrides, False)[0], out / "alone")
        rows = [("alone", [alone])]
        for k in map(int, args.ks.split(",")):
            runs = runs_of(k, args, args.overrides, True)
            rows.append((f"K={k}", train_batched(runs, [out / f"k{k}-{i}" for i in range(k)])))
        for name, summaries in rows:
            if failed := [s["status"] for s in summaries if s["status"] != "completed"]:
                table.add_row(name, f"{len(failed)} of {len(summaries)} runs {', '.join(set(failed))}")
                continue
            tokens = sum(s["tokens_per_s"] for s in summaries)
            mfu = sum(s["mfu"] for s in summaries) if summaries[0]["mfu"] is not None else None
            base = tokens if name == "K=1" else base
            ratio = f"{tokens / base:.2f}x" if base and name != "alone" else "-"
            table.add_row(
                name,
                f"{tokens:,.0f}",
                ratio,
                f"{100 * mfu:.1f}%" if mfu is not None else "-",
                f"{summaries[0]['step_ms_p50']:.1f}",
                f"{max(s['peak_mem_mb'] for s in summaries):,.0f}",
            )
        peak = alone["peak_flops"]
        console.print(table)
        console.print(f"MFU against {peak / 1e12:.4g} TFLOP/s ({alone['peak_flops_source']})")
    if args.attention:
        run = runs_of(1, args, args.overrides, True)[0]
        model, b = run.model, run.train.batch_size
        dtype = PRECISIONS[run.train.precision]
        shape = (b, model.n_head, model.block_size, model.d_model // model.n_head)
        title = f"causal attention under vmap, fwd+bwd ms, {dtype}, (B, heads, T, head_dim) = {shape}"
        attn = Table(title=title)
        for column in ("seeds", "written out", "vmap(sdpa)"):
            attn.add_column(column, justify="right")
        for k in map(int, args.ks.split(",")):
            ms = attention_ms(args.device, dtype, k, *shape)
            attn.add_row(str(k), *(f"{v:.2f}" if isinstance(v, float) else v for v in ms.values()))
        console.print(attn)


if __name__ == "__main__":
    main()

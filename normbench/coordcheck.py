"""The coordinate check behind ``normbench coordcheck``: does each layer's activation scale stay put as the
model widens?

microsoft/mup's check (Tensor Programs V, Yang et al. 2022, Fig. 5 and appendix D.1): the same config and
seed at several widths (``model.d_model``; ``model.n_head`` held fixed, so head_dim grows with the
width), trained a few Adam steps at train.lr, held constant (no warm-up, no decay, no clipping: the
update the parametrization scales, nothing else), on the same batches. At init (step 0) and after each
step, forward hooks take the RMS of each block's output on one fixed batch, and the logits' RMS.
Under μP the curves are flat across widths; under SP they grow with it. Writes ``coordcheck.csv``
(param, width, step, layer, rms) and ``coordcheck.png`` (rms against width, log-log, one panel per
param and step). docs/norms-and-placements.md#the-coordinate-check.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from rich.console import Console

from normbench.core.configtree import compose
from normbench.core.devices import resolve_device
from normbench.core.errors import ConfigError
from normbench.core.fileio import write_atomic
from normbench.data.corpus import build_dataset
from normbench.model import extensions
from normbench.model.gpt import GPT, PARAMS, leaves_no_trace
from normbench.training.config import parse_config
from normbench.training.optim import build_optimizer

COLUMNS = ["param", "width", "step", "layer", "rms"]


def parse_widths(text: str) -> list[int]:
    """``--widths 32,64,128``: at least two distinct positive integers, in increasing order."""
    try:
        widths = sorted({int(w) for w in text.split(",") if w.strip()})
    except ValueError:
        widths = []
    if len(widths) < 2 or widths[0] < 1:
        raise ConfigError(
            f"--widths takes two or more positive integers, got {text!r}", allowed=["32,64,128,256"]
        )
    return widths


def parse_params(text: str) -> list[str]:
    """``--param sp``, ``mup`` or ``both``."""
    if text == "both":
        return list(PARAMS)
    if text not in PARAMS:
        raise ConfigError(f"unknown --param '{text}'", allowed=[*PARAMS, "both"])
    return [text]


def block_rms(run, steps: int) -> list[dict]:
    """Train one config ``steps`` Adam steps; the RMS of each block's output and of the logits on one
    fixed batch, at init and after every step: rows (step, layer, rms)."""
    device = resolve_device(run.train.device)
    torch.manual_seed(run.seed)
    data = build_dataset(run.data, run.model.block_size, run.train.batch_size)
    model = GPT(run.model, data.vocab_size, run.norm, run.placement).to(device)
    optimizer = build_optimizer(model, run.train, device)
    fixed = next(iter(data.val_batches(1, run.train.batch_size)))[0].to(device)
    batches = torch.Generator().manual_seed(run.seed)
    measured: dict[str, float] = {}

    def hook(name):
        def store(module, inputs, output):
            measured[name] = float(output.detach().float().pow(2).mean().sqrt())

        return store

    for i, block in enumerate(model.blocks, 1):
        block.register_forward_hook(hook(f"block{i}"))
    rows = []
    for step in range(steps + 1):
        if step:
            x, y = data.train_batch(run.train.batch_size, batches)
            model(x.to(device), y.to(device))[1].backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        with torch.no_grad(), leaves_no_trace(model):
            measured["logits"] = float(model(fixed)[0].float().pow(2).mean().sqrt())
        rows += [{"step": step, "layer": layer, "rms": rms} for layer, rms in measured.items()]
    return rows


def coord_check(overrides: list[str], widths: list[int], steps: int, params: list[str]) -> pd.DataFrame:
    """One row per (param, width, step, layer). Under mup without model.base_width, the narrowest width is
    the base."""
    if steps < 1:
        raise ConfigError(f"--steps must be a positive integer, got {steps}")
    extensions.install()  # installed packages' norms and placements are config options too
    rows = []
    for param in params:
        for width in widths:
            cfg = compose([*overrides, f"model.d_model={width}", f"model.param={param}"])
            if param == "mup" and cfg.model.base_width is None:
                cfg.model.base_width = widths[0]
            rows += [{"param": param, "width": width, **row} for row in block_rms(parse_config(cfg), steps)]
    return pd.DataFrame(rows, columns=COLUMNS)


def growth(table: pd.DataFrame) -> pd.DataFrame:
    """Per param and layer: rms at the widest width over rms at the narrowest, at the last step."""
    last = table[table.step == table.step.max()]
    wide, narrow = (
        last[last.width == w].set_index(["param", "layer"]).rms for w in (last.width.max(), last.width.min())
    )
    return (wide / narrow).rename("ratio").reset_index()


def chart(table: pd.DataFrame):
    """rms against width, log-log: one row of panels per param, one panel per step, one line per layer."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    params, steps = list(dict.fromkeys(table.param)), sorted(table.step.unique())
    layers, widths = list(dict.fromkeys(table.layer)), sorted(table.width.unique())
    colors = colormaps["viridis"].resampled(len(layers))
    fig = Figure(figsize=(2.6 * len(steps) + 1.5, 2.4 * len(params) + 0.6), layout="constrained")
    axes = fig.subplots(len(params), len(steps), sharex=True, sharey=True, squeeze=False)
    for row, param in enumerate(params):
        for col, step in enumerate(steps):
            ax = axes[row][col]
            for i, layer in enumerate(layers):
                line = table[
                    (table.param == param) & (table.step == step) & (table.layer == layer)
                ].sort_values("width")
                ax.plot(line.width, line.rms, marker="o", ms=3, color=colors(i), label=layer)
            ax.set_xscale("log", base=2)
            ax.set_xticks(widths, [str(w) for w in widths], minor=False)
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_yscale("log")
            ax.set_title(f"{param}, step {step}", fontsize=9)
            if row == len(params) - 1:
                ax.set_xlabel("width (d_model)")
            if col == 0:
                ax.set_ylabel("activation RMS")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle("coordinate check: flat across widths under μP, growing under SP", fontsize=10)
    return fig


def run_coordcheck(
    overrides: list[str], widths: str, steps: int, param: str, out: Path, console: Console | None = None
) -> pd.DataFrame:
    """``normbench coordcheck``: the table, its CSV and chart under ``out``, and one summary line per
    param."""
    console = console or Console()
    table = coord_check(overrides, parse_widths(widths), steps, parse_params(param))
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "coordcheck.csv", table.to_csv(index=False))
    chart(table).savefig(out / "coordcheck.png", dpi=120)
    ratios = growth(table)
    narrow, wide, last = table.width.min(), table.width.max(), table.step.max()
    for param, rows in ratios.groupby("param", sort=False):
        each = ", ".join(f"{r.layer} {r.ratio:.2f}x" for r in rows.itertuples())
        console.print(
            f"{param}: rms at width {wide} / width {narrow} after {last} steps: {each} "
            f"(largest change {max(rows.ratio.max(), 1 / rows.ratio.min()):.2f}x)",
            highlight=False,
        )
    console.print(f"wrote {out / 'coordcheck.csv'} and {out / 'coordcheck.png'}", highlight=False)
    return table

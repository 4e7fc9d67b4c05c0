"""The charts inside the model and over training: gradient norm and residual RMS by layer, the depth
profile, the gradient profile per placement, the global gradient norm, the attention- and
output-logit growth, and the stability map over the learning rate."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pandas as pd

from normbench.report.charts.panels import (
    _at_best_note,
    _bands,
    _completed,
    _curves,
    _draw_lines,
    _figure,
    _legend,
    _plain,
)
from normbench.report.charts.registry import chart
from normbench.report.load import ReportData, layer_skip
from normbench.report.tables import _fmt_value
from normbench.report.tuning import at_best


@chart("grad_by_layer", "Gradient norm and residual RMS by layer")
def chart_grad_by_layer(d: ReportData):
    layers = at_best(d, d.layers)
    first = layers[layers["when"].eq("first")]
    last = _completed(d, layers[layers["when"].eq("last")])  # the init picture holds for every run
    steps = first["step"].dropna().unique()
    at = f"step {steps[0]:.0f}" if len(steps) == 1 else "first stats record"
    panels = [
        (first, "grad", f"mlp_out grad norm, {at}", "grad norm of mlp_out weight (L2)", True),
        (last, "grad", "mlp_out grad norm, last stats record", "grad norm of mlp_out weight (L2)", True),
        (last, "resid_rms", "Residual-stream RMS, last stats record", "residual RMS", False),
        # DyT and Derf only: docs/diagnostics.md#saturation-of-the-point-wise-norms
        (
            last,
            "saturation",
            "Point-wise norms: inputs saturated (|αx| > 2), last stats record",
            "fraction of inputs (largest norm of the layer)",
            False,
        ),
    ]
    title = (
        "Per-layer gradients (Xiong et al. 2020: Post-LN's grow toward the output) and residual "
        f"RMS{_at_best_note(d)}"
    )
    return _layer_panels(d, panels, title) or "no per-layer stats records in metrics.jsonl"


def _layer_panels(d: ReportData, panels: list[tuple], title: str):
    """One panel per (frame, column, title, ylabel, log y) against the layer index, bands over seeds;
    None when no panel has data."""
    panels = [p for p in panels if p[0][p[1]].notna().any()]
    if not panels:
        return None
    fig, axes = _figure(len(panels))
    for ax, (frame, y, panel_title, ylabel, logy) in zip(axes, panels):
        _bands(ax, d, _curves(d, frame, "layer", y), log=logy)
        ax.set(title=panel_title, xlabel="layer (block index, input → output)", ylabel=ylabel)
        ax.set_yscale("log" if logy else "linear")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    _legend(fig, axes)
    return fig


@chart("depth_profile", "Residual variance by layer and each layer's contribution")
def chart_depth_profile(d: ReportData):
    layers = at_best(d, d.layers)
    first, last = layers[layers["when"].eq("first")], _completed(d, layers[layers["when"].eq("last")])
    skip = at_best(d, layer_skip(d))
    panels = [
        (
            first,
            "resid_var",
            "Residual-stream variance, first stats record (init)",
            "variance of block output",
            True,
        ),
        (last, "resid_var", "Residual-stream variance, last stats record", "variance of block output", True),
        (
            skip,
            "skip_rise",
            "Loss rise with the layer skipped (end of training)",
            "val loss - full model's",
            False,
        ),
    ]
    title = (
        "The curse of depth (Sun et al. 2025): Pre-LN's variance grows with depth and its deep layers\n"
        f"contribute little; LayerNorm Scaling (model.ln_scaling) should flatten both{_at_best_note(d)}"
    )
    return _layer_panels(d, panels, title) or (
        "no per-layer residual variance or layer-skip losses (train.stats_every=0, or older runs)"
    )


@chart("grad_profile", "Gradient norm by layer, one panel per placement")
def chart_grad_profile(d: ReportData):
    layers = at_best(d, d.layers)
    layers = layers.assign(placement=layers["run"].map(d.runs["placement"]))
    placements = list(dict.fromkeys(layers.dropna(subset=["grad_layer"])["placement"]))
    if len(placements) < 2 or layers["layer"].max() < 1:
        return None if not len(layers) else "one placement or one layer: no profile to set side by side"
    fig, axes = _figure(len(placements), width=4.5, height=3.8, ncols=len(placements))
    for ax, placement in zip(axes, placements):
        part = layers[layers["placement"].eq(placement)]
        for when, alpha in (("first", 0.45), ("last", 1.0)):
            frame = part[part["when"].eq(when)]
            frame = frame if when == "first" else _completed(d, frame)
            means = frame.assign(config=frame["run"].map(d.runs["config"])).groupby(["config", "layer"])
            profiles = means["grad_layer"].mean()
            order = [c for c in d.agg["config"] if c in profiles.index.get_level_values(0)]
            _draw_lines(
                ax,
                d.styles,
                {config: profiles.loc[config] for config in order},
                log=True,
                note=when == "last",
                alpha=alpha,
                # one legend entry per configuration: the faint init line is said in the title
                **({} if when == "last" else {"label": "_nolegend_"}),
            )
        ax.set(title=_plain(f"placement={placement}"), xlabel="layer (input → output)", yscale="log")
        ax.set_ylabel("grad norm of the layer (L2, all its weights)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    fig.suptitle(
        "Per-layer gradient norm at the last stats record (faint: at init)\n"
        "Mix-LN (arXiv 2412.13795): Pre-LN's shrink in the deep layers,\n"
        f"Post-LN's in the early ones{_at_best_note(d)}"
    )
    _legend(fig, axes)
    return fig


@chart("grad_norm", "Global gradient norm over training")
def chart_grad_norm(d: ReportData):
    grads = _completed(d, at_best(d, d.grads))
    if not grads["grad_norm"].notna().any():
        return "no completed run logged stats records with grad_norm"
    fig, (ax,) = _figure(1, width=8)
    _bands(ax, d, _curves(d, grads, "step", "grad_norm"), log=True)
    ax.set(
        title=f"Global gradient norm over training\n(completed runs{_at_best_note(d)})",
        xlabel="step",
        ylabel="grad norm (L2)",
        yscale="log",
    )
    ax.grid(alpha=0.3)
    _legend(fig, [ax])
    return fig


@chart("logits", "Attention-logit and output-logit growth")
def chart_logits(d: ReportData):
    """Wortsman et al. 2023: attention logits grow until attention collapses (QK-norm fixes it),
    output logits drift (z-loss fixes it). Diverged runs are drawn up to their last finite value."""
    panels = [
        ("max_attn_logit", "Max attention logit vs step", "max attention logit (after scaling)", "log"),
        ("max_log_z", "Max log Z (output log-partition) vs step", "max log Z (nats)", "linear"),
    ]
    panels = [p for p in panels if d.logits[p[0]].notna().any()]
    # Under a soft-cap (model.attn_softcap) the capped logit stays below the cap: the logit before
    # it shows whether the growth went on underneath (docs/diagnostics.md). Only when some run was capped.
    if d.logits["max_attn_logit_raw"].ne(d.logits["max_attn_logit"]).any():
        panels.insert(
            1,
            (
                "max_attn_logit_raw",
                "Max attention logit before the soft-cap vs step",
                "max attention logit, raw (before the cap)",
                "log",
            ),
        )
    if not panels:
        return (
            "no stats record with logit diagnostics in metrics.jsonl (runs older than them, or "
            "train.stats_every=0)"
        )
    fig, axes = _figure(len(panels), width=6.0, height=4.2)
    for ax, (y, title, ylabel, scale) in zip(axes, panels):
        _bands(ax, d, _curves(d, d.logits, "step", y), log=scale == "log")
        ax.set(title=title, xlabel="step", ylabel=ylabel, yscale=scale)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(
        "Logit growth: mean over seeds, band = min–max (diverged runs up to their last finite value)"
    )
    _legend(fig, axes)
    return fig


@chart("stability", "Stability map (learning rate)")
def chart_stability(d: ReportData):
    runs = d.runs
    if "train.lr" not in runs or runs["train.lr"].nunique() < 2:
        return "train.lr does not vary across runs"
    varying = [k for k in ("train.warmup_steps", "model.n_layer") if k in runs and runs[k].nunique() > 1]
    ykey = varying[0] if varying else None
    panel_keys = ["norm", "placement", *varying[1:]]
    cells = (
        runs.assign(
            lr=pd.to_numeric(runs["train.lr"], errors="coerce"),
            y=runs[ykey] if ykey else "",
            loss=runs["final_val_loss"].where(runs["status"].eq("completed")),
            bad=runs["status"].isin(["diverged", "failed"]),
        )
        .groupby([*panel_keys, "y", "lr"], dropna=False)
        .agg(loss=("loss", "mean"), bad=("bad", "sum"), n=("bad", "size"))
        .reset_index()
    )
    lrs, ys = sorted(cells["lr"].dropna().unique()), sorted(cells["y"].dropna().unique())
    finite = cells["loss"].dropna()
    vmin, vmax = (finite.min(), finite.max()) if len(finite) else (0, 1)
    panels = list(cells.groupby(panel_keys, dropna=False))
    fig, axes = _figure(len(panels), width=max(3.5, 0.8 * len(lrs) + 1), height=max(2.5, 0.5 * len(ys) + 1.5))
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.85")
    for ax, (pkey, cell) in zip(axes, panels):
        loss = cell.pivot(index="y", columns="lr", values="loss").reindex(index=ys, columns=lrs)
        bad = cell.pivot(index="y", columns="lr", values="bad").reindex(index=ys, columns=lrs)
        n = cell.pivot(index="y", columns="lr", values="n").reindex(index=ys, columns=lrs)
        im = ax.imshow(
            np.ma.masked_invalid(loss.to_numpy(float)),
            cmap=cmap,
            vmin=vmin,
            vmax=vmax,
            aspect="auto",
            origin="lower",
        )
        for (i, j), value in np.ndenumerate(loss.to_numpy(float)):
            n_bad, n_all = bad.iat[i, j], n.iat[i, j]
            text = "" if math.isnan(value) else f"{value:.2f}"
            if n_bad > 0:
                text += f"\n× {n_bad:.0f}/{n_all:.0f} div" if text else f"× {n_bad:.0f}/{n_all:.0f}\ndiverged"
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize="x-small",
                color="red" if n_bad > 0 else ("white" if value < (vmin + vmax) / 2 else "black"),
            )
        ax.set_xticks(range(len(lrs)), [f"{v:g}" for v in lrs], rotation=35)
        ax.set_yticks(range(len(ys)), [_fmt_value(v) for v in ys])
        ax.set(
            title=_plain(" / ".join(map(_fmt_value, pkey))),
            xlabel="peak learning rate (train.lr)",
            ylabel=ykey or "",
        )
    fig.colorbar(im, ax=list(axes), label="final val loss (nats/token), mean over completed seeds")
    fig.suptitle("Stability map: grey × cells = diverged/failed runs (not averaged)")
    return fig

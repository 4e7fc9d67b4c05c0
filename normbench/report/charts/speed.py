"""The speed charts: the runs' throughput, step time and memory, and the norm micro-benchmark
(``normbench bench``'s CSVs), each with the note on what an implementation's cost says."""

from __future__ import annotations

import matplotlib.ticker
from matplotlib.figure import Figure

from normbench.report.charts.panels import _bars, _compared_norms, _figure, _legend, _note, _plain
from normbench.report.charts.registry import chart
from normbench.report.charts.styles import IMPL_LINESTYLES, norm_color
from normbench.report.cost import LIMIT, implementation_note
from normbench.report.load import ReportData


@chart("throughput", "Throughput, step time and memory")
def chart_throughput(d: ReportData):
    agg = d.agg
    panels = [
        # the steps' figure: evals, checkpoints and set-up are outside it (summary.json's
        # wall_tokens_per_s counts them)
        ("tokens_per_s_mean", None, "Throughput in steps (median window)", "tokens/s"),
        ("step_ms_p50_mean", "step_ms_p90_mean", "Step time (bar p50, whisker p90)", "ms/step"),
        ("peak_mem_mb_mean", None, "Peak memory", "MB"),
    ]
    panels = [p for p in panels if agg[p[0]].notna().any()]
    if not panels:
        return "no run reported tokens_per_s, step time or peak memory"
    # Many configurations make wide bar panels: stack them instead of putting them side by side.
    fig, axes = _figure(
        len(panels), width=max(4.0, 0.4 * len(agg) + 1.5), height=4.5, ncols=1 if len(agg) > 6 else 3
    )
    for ax, (col, upper, title, unit) in zip(axes, panels):
        errs = (
            None if upper is None else [[[0], [u]] for u in (agg[upper] - agg[col]).clip(lower=0).fillna(0)]
        )
        _bars(ax, d, agg[col], errs)
        ax.set(title=title, ylabel=unit)
        ax.grid(axis="y", alpha=0.3)
    if len(axes) > 1 and len(agg) > 6:
        for ax in axes[:-1]:  # stacked panels share the configuration labels of the bottom one
            ax.tick_params(labelbottom=False)
    fig.suptitle(
        "Speed and memory per configuration (mean over runs): the training steps' own figures,\n"
        "not the wall clock (evals, checkpoints: summary.json's wall_tokens_per_s)"
    )
    norms = _compared_norms(d)
    if norms:
        _note(fig, implementation_note(d.bench, norms))
    return fig


@chart("bench", "Norm micro-benchmark", needs_runs=False)
def chart_bench(d: ReportData):
    bench = d.bench
    if bench is None or bench.empty:
        return "no bench CSV among the inputs (pass the file from `normbench bench --out X.csv`)"
    # One panel per setting that changes the timings, so each line compares like with like.
    keys = ["device", "dtype", "pass"] + ["tokens"] * ("tokens" in bench and bench["tokens"].nunique() > 1)
    panels = list(bench.groupby(keys, sort=True))
    # ratio_to_ln (derived for older CSVs from their LayerNorm rows); the times where there is none.
    ratio = "ratio_to_ln" in bench and bench["ratio_to_ln"].notna().any()
    y, ylabel = ("ratio_to_ln", "time / LayerNorm's native time") if ratio else ("ms", "time per call (ms)")
    copy = bench["gb_per_s"] / bench["copy_gb_per_s"] if {"gb_per_s", "copy_gb_per_s"} <= set(bench) else None
    mine = bench["impl"].eq("normbench")
    rows = 2 if copy is not None and copy[mine].notna().any() else 1
    fig = Figure(figsize=(4.6 * len(panels) + 1.8, 3.9 * rows), layout="constrained")
    axes = fig.subplots(rows, len(panels), squeeze=False)
    for i, (panel, part) in enumerate(panels):
        ax = axes[0, i]
        for (norm, impl), line in part.groupby(["norm", "impl"], sort=True):
            line = line.sort_values("dim")
            ax.plot(
                line["dim"],
                line[y],
                color=norm_color(norm),
                linestyle=IMPL_LINESTYLES.get(str(impl), "-."),
                marker="o",
                markersize=3,
                label=_plain(f"{norm} ({impl})"),
            )
            if rows == 2 and impl == "normbench":
                share = 100 * copy[line.index]
                axes[1, i].plot(
                    line["dim"],
                    share,
                    color=norm_color(norm),
                    marker="o",
                    markersize=3,
                    label=_plain(f"{norm} ({impl})"),
                )
        if ratio:
            ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="LayerNorm (native) = 1")
            ax.axhline(LIMIT, color="black", linestyle=":", linewidth=1, label=f"goal: {LIMIT}x LayerNorm")
        title = " · ".join(f"{k}={v}" if k == "tokens" else str(v) for k, v in zip(keys, panel))
        ax.set(title=_plain(title), xlabel="hidden size (dim)", ylabel=ylabel)
        dims = sorted(part["dim"].dropna().unique())
        for a in axes[:, i]:
            a.set_xscale("log", base=2)
            a.set_xticks(dims, [f"{v:g}" for v in dims])  # the widths measured, not powers of two
            a.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            a.grid(alpha=0.3, which="both")
        ax.set_yscale("log")
        if ratio:  # ratios near 1 span less than a decade: ticks read 1x, 1.25x, 1.5x, 2x, ...
            ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1, 1.25, 1.5, 2, 3, 5, 7)))
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        if rows == 2:
            axes[1, i].set(
                title=_plain(f"{title}: normbench's bandwidth"),
                xlabel="hidden size (dim)",
                ylabel="% of copy bandwidth (clone)",
                ylim=(0, None),
            )
    what = "time relative to LayerNorm's native op" if ratio else "time per call (no ratio_to_ln in the CSV)"
    fig.suptitle(
        f"Norm micro-benchmark: {what}"
        + ("\nbottom: normbench's GB/s as % of a plain copy's" if rows == 2 else "")
        + "\n(colour = norm, line style = implementation)"
    )
    _legend(fig, axes.ravel())
    _note(fig, implementation_note(bench))
    return fig

"""The loss and tuning charts: the loss curves, the final loss per configuration with the verdict's
differences, and the final loss against the tuned key (LR sensitivity)."""

from __future__ import annotations

import math

import matplotlib.ticker
import numpy as np
import pandas as pd

from normbench.core.runs import LEARN_MARGIN
from normbench.report.charts.panels import (
    _at_best_note,
    _bands,
    _completed,
    _curves,
    _figure,
    _floor,
    _legend,
    _note,
    _places,
    _plain,
    metric_label,
    zoom_window,
)
from normbench.report.charts.registry import chart
from normbench.report.charts.styles import coinciding, line_style, make_styles
from normbench.report.load import LEARNED_FRACTION, ReportData
from normbench.report.metrics import loss_unit, metric
from normbench.report.tuning import at_best, tuned_configs


@chart("loss_curves", "Loss curves")
def chart_loss_curves(d: ReportData):
    train, evals = _completed(d, at_best(d, d.train)), _completed(d, at_best(d, d.evals))
    panels = [
        (train, "step", "train_loss", "Train loss vs step", "step"),
        (evals, "step", "val_loss", "Validation loss vs step", "step"),
        (train, "tokens", "train_loss", "Train loss vs tokens", "tokens seen"),
    ]
    panels = [p for p in panels if p[0][[p[1], p[2]]].notna().all(axis=1).any()]
    if not panels:
        return "no completed run logged train or eval losses in metrics.jsonl"
    curves = [_curves(d, frame, x, y) for frame, x, y, _, _ in panels]
    # curves that end close together, relative to how far they fell, get a zoom on their last part
    zooms = [
        (c, window, title, xlabel)
        for c, window, (_, x, _, title, xlabel) in zip(curves, map(zoom_window, curves), panels)
        if window and x == "step"
    ]
    fig, axes = _figure(len(panels) + len(zooms))
    done = d.runs[d.runs["status"].eq("completed")]
    for ax, c, (_, _, _, title, xlabel) in zip(axes, curves, panels):
        _bands(ax, d, c)
        _floor(ax, done)
        ax.set(title=title, xlabel=xlabel, ylabel=f"loss ({loss_unit(d.metric)})")
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter())  # 150k, not 150000 against 160000
    for ax, (c, (since, ylim), title, xlabel) in zip(axes[len(panels) :], zooms):
        _bands(ax, d, c, since)
        _floor(ax, done)
        ax.set(
            title=f"{title}, zoomed from {xlabel} {since:,.0f}\n(the ends lie within a tenth of the range)",
            xlabel=xlabel,
            ylabel=f"loss ({loss_unit(d.metric)})",
            ylim=ylim,
        )
        ax.grid(alpha=0.3)
    fig.suptitle(f"Loss curves: mean over seeds, band = min–max (completed runs only{_at_best_note(d)})")
    _legend(fig, axes)
    return fig


def _compared(d: ReportData) -> tuple[pd.DataFrame, pd.Series, dict]:
    """What the verdict compares: its table (tuned.csv's rows when tuning, else aggregate.csv's), each
    run's label in it (NaN: a run at another value of the tuned key), and the labels' styles."""
    if d.tune is None or d.tuned is None:
        return d.agg, d.runs["config"], d.styles
    labels = tuned_configs(d).where(d.runs.index.isin(at_best(d, d.runs.assign(run=d.runs.index))["run"]))
    return d.tuned, labels, make_styles(d.runs.assign(config=tuned_configs(d)), d.tuned)


@chart("final_loss", "Final validation loss per configuration")
def chart_final_loss(d: ReportData):
    table, labels, styles = _compared(d)
    runs = d.runs.assign(_label=labels).dropna(subset=["_label"])
    column = metric(d.metric).source
    done = runs[runs["status"].eq("completed")].dropna(subset=[column])
    if done.empty and not runs["status"].isin(["diverged", "failed"]).any():
        return f"no run reported {column}"
    # With a size axis the verdict compares within each size (the scale_gap chart), not across the rows.
    diffs = d.scale is None and table["diff_ci_low"].notna().any()
    width = max(5.0, 0.45 * len(table) + 2)
    fig, axes = _figure(1 + diffs, width=width, height=5.0, ncols=2)
    at = {label: i for i, label in enumerate(table["config"])}
    # runs of one seed at different sizes are no pair: joined only without a size axis
    _seed_points(axes[0], runs, done[column], at, styles, join=d.scale is None)
    joined = "grey lines join the runs of one seed;\n" if d.scale is None else ""
    axes[0].set(
        title=_plain(
            f"{metric(d.metric).header.capitalize()} of each run{_at_best_note(d)}\n"
            f"({joined}bar = mean over completed seeds)"
        ),
        ylabel=metric_label(d),
    )
    if d.scale is not None:
        _note(
            fig,
            "With a size axis the verdict compares the configurations within each size: their paired "
            "differences are in the chart of the difference to the baseline against size.",
        )
    if diffs:
        _differences(axes[1], d, table, styles)
    for ax in axes:
        ax.set_xticks(
            range(len(table)), table["config"].map(_plain), rotation=35, ha="right", fontsize="small"
        )
        ax.grid(axis="y", alpha=0.3)
    _legend(fig, axes)
    return fig


def _seed_points(ax, runs: pd.DataFrame, values: pd.Series, at: dict, styles, join: bool) -> None:
    """Each completed run's value of the compared metric (``values``, by run) at its configuration
    (``join``: the runs of one seed joined by a grey line, the pairs the verdict's paired test
    compares), a bar at each configuration's mean, and a red × with the count where runs diverged
    or failed."""
    done = runs.loc[values.index].assign(_value=values)
    x = done["_label"].map(at)
    for i, (_, seed) in enumerate(done.assign(_x=x).sort_values("_x").groupby("seed", sort=True)):
        if len(seed) > 1 and join:
            ax.plot(
                seed["_x"],
                seed["_value"],
                color="grey",
                linewidth=0.8,
                alpha=0.6,
                label="runs of one seed" if i == 0 else None,
                zorder=1,
            )
    for label, i in at.items():
        part, style = done[done["_label"].eq(label)], styles[label]
        # the seeds side by side: points with the same loss stay apart
        offsets = np.linspace(-0.12, 0.12, len(part)) if len(part) > 1 else [0.0]
        part = part.sort_values("seed")
        ax.plot(
            i + np.asarray(offsets),
            part["_value"],
            linestyle="none",
            marker=style["marker"],
            markersize=7,
            color=style["color"],
            markeredgecolor="black",
            markeredgewidth=0.5,
            zorder=3,
        )
        if len(part):
            ax.hlines(part["_value"].mean(), i - 0.3, i + 0.3, color="black", linewidth=1.5, zorder=2)
        stuck = part["did_not_learn"].eq(True).to_numpy() if "did_not_learn" in part else []
        if np.any(stuck):  # completed, but learned nothing: a ring round each, named in the legend
            ax.plot(
                (i + np.asarray(offsets))[stuck],
                part["_value"][stuck],
                linestyle="none",
                marker="o",
                markersize=14,
                markerfacecolor="none",
                markeredgecolor="red",
                markeredgewidth=1.5,
                label=(
                    f"did not learn (final loss ≥ {LEARNED_FRACTION:.0%} of its loss at init, "
                    f"or ≥ unigram − {LEARN_MARGIN})"
                ),
                zorder=4,
            )
        bad = runs["_label"].eq(label) & runs["status"].isin(["diverged", "failed"])
        if bad.any():
            if part.empty:  # nothing completed: a hatched slot, so it is not read as missing data
                ax.axvspan(i - 0.4, i + 0.4, fill=False, hatch="xx", edgecolor="red", linewidth=0.5)
            ax.plot(
                i,
                0.95,
                "x",
                color="red",
                markersize=9,
                markeredgewidth=2,
                transform=ax.get_xaxis_transform(),
                label="diverged/failed runs (not averaged)",
            )
            ax.annotate(
                f"{bad.sum()}/{runs['_label'].eq(label).sum()}",
                (i, 0.91),
                xycoords=ax.get_xaxis_transform(),
                ha="center",
                va="top",
                color="red",
                fontsize="small",
                backgroundcolor="white",
            )
    if len(done):  # room above for the diverged marks
        low, high = done["_value"].min(), done["_value"].max()
        span = max(high - low, 0.05 * abs(high), 1e-3)
        ax.set_ylim(low - 0.15 * span, high + 0.5 * span)


def _differences(ax, d: ReportData, table: pd.DataFrame, styles) -> None:
    """Each configuration's difference to the best with the 95% interval the verdict states (the
    columns compare_with_best wrote: paired by seed where both ran the same seeds, else Welch)."""
    best = table.loc[table["vs_best"].eq("best"), "config"]
    ax.axhline(0.0, color="black", linewidth=1)
    for i, row in enumerate(table.itertuples(index=False)):
        style = styles[row.config]
        if pd.isna(row.diff_vs_best):
            continue
        has_ci = pd.notna(row.diff_ci_low)
        ax.errorbar(
            [i],
            [row.diff_vs_best],
            yerr=[[row.diff_vs_best - row.diff_ci_low], [row.diff_ci_high - row.diff_vs_best]]
            if has_ci
            else None,
            color=style["color"],
            marker="*" if row.vs_best == "best" else style["marker"],
            markersize=12 if row.vs_best == "best" else 7,
            markeredgecolor="black",
            markeredgewidth=0.5,
            capsize=5,
            linewidth=2,
            linestyle="none",
        )
        p = "" if pd.isna(row.p_value) else (", p<0.001" if row.p_value < 1e-3 else f", p={row.p_value:.2g}")
        ax.annotate(
            _plain(f"{row.vs_best}{p}"),
            (i, row.diff_ci_high if has_ci else row.diff_vs_best),
            xytext=(0, 6),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize="x-small",
        )
    tests = table["test"].dropna().unique()
    how = tests[0] if len(tests) == 1 else "paired by seed where the seeds match, else Welch"
    ax.set(
        title=_plain(
            f"Difference to the best, {best.iloc[0] if len(best) else '–'},\nas the verdict tests it "
            f"(bar = 95% CI\nof the difference: {how})"
        ),
        ylabel=_plain(f"{metric(d.metric).header} − the best's ({metric(d.metric).unit})"),
    )
    ax.margins(y=0.15)


@chart("tuning", "Final loss against the tuned key (LR sensitivity)")
def chart_tuning(d: ReportData):
    """Wortsman et al.'s Fig. 1: final loss against the learning rate, one line per configuration."""
    if d.tune is None or d.tuned is None:
        return "no tuning key (train.lr does not vary, or --tune none)"
    from normbench.report.stats import mean_ci

    key = d.tune
    runs = d.runs.assign(_value=pd.to_numeric(d.runs[key], errors="coerce"), _config=tuned_configs(d))
    styles = make_styles(runs.assign(config=runs["_config"]), d.tuned)
    curves = {
        row.config: _tuning_points(runs[runs["_config"].eq(row.config)], mean_ci)
        for row in d.tuned.itertuples()
    }
    best = d.tuned["final_val_loss_mean"].dropna()
    init = d.tuned["loss_init"].dropna()
    top = max(
        [y for pts in curves.values() for _, y, _, _ in pts if math.isfinite(y)] + list(init),
        default=math.nan,
    )
    # A configuration far from the rest (DyT, no norm) stretches the axis until the curves that
    # matter, those near the best, are one line: a second panel zooms in on them.
    zoom = (best.min() - 0.05, best.min() + 0.35) if len(best) and top - best.min() > 1.0 else None
    fig, axes = _figure(2 if zoom else 1, width=7.0 if zoom else 8.5, height=5.0, ncols=2)
    rows = list(d.tuned.itertuples(index=False))
    places = _places(coinciding([_tuning_line(curves[row.config]) for row in rows]))
    for ax in axes:
        for row, place in zip(rows, places):
            _tuning_curve(ax, row, curves[row.config], styles[row.config], place)
        # markers after every line: the legend lists configs first
        for row in d.tuned.itertuples(index=False):
            _tuning_marks(ax, row, curves[row.config], styles[row.config])
        if len(init):
            ax.axhline(init.mean(), color="grey", linestyle="--", linewidth=1, label="loss at init (step 0)")
        _floor(ax, d.runs)
        values = runs["_value"].dropna()
        if len(values) and (values > 0).all() and values.max() / values.min() >= 10:
            ax.set_xscale("log")
        ax.set(xlabel=key, ylabel=metric_label(d))
        ax.grid(alpha=0.3, which="both")
    axes[0].set_title(
        f"Final validation loss against {key}\n(mean over completed seeds, band = 95% CI; × = diverged)"
    )
    if zoom:
        axes[1].set_ylim(*zoom)
        axes[1].set_title(f"The same, near the best\n(best {best.min():.3f} to +0.35)")
    _legend(fig, axes)
    return fig


def _tuning_points(group: pd.DataFrame, mean_ci) -> list[tuple]:
    """Per value of the tuned key: (value, mean final loss over completed seeds, its CI, seeds that
    diverged; a failed run is not drawn)."""
    points = []
    for value, at in group.groupby("_value"):
        done = at.loc[at["status"].eq("completed"), "final_val_loss"].dropna()
        diverged = int(at["status"].eq("diverged").sum())
        points.append((value, done.mean() if len(done) else math.nan, mean_ci(done), diverged))
    return points


def _tuning_line(points: list[tuple]) -> pd.Series:
    return pd.Series([p[1] for p in points], index=[p[0] for p in points], dtype=float)


def _tuning_curve(ax, row, points: list[tuple], style: dict, place: tuple[int, int] = (0, 1)) -> None:
    """``place``: the curve's (k, n) among those it coincides with (``line_style``)."""
    xs = [p[0] for p in points]
    ys = np.array([p[1] for p in points], float)
    sens = "" if pd.isna(row.lr_sensitivity) else f"  (sensitivity {row.lr_sensitivity:.3f})"
    ax.plot(xs, ys, label=_plain(row.config + sens), **line_style(style, *place))
    if any(p[2] is not None for p in points):
        ax.fill_between(
            xs,
            [p[2].low if p[2] else p[1] for p in points],
            [p[2].high if p[2] else p[1] for p in points],
            color=style["color"],
            alpha=0.15,
            linewidth=0,
        )


def _tuning_marks(ax, row, points: list[tuple], style: dict) -> None:
    # diverged seeds: an x at the loss at init, where the sensitivity counts them
    bad = [p[0] for p in points if p[3]]
    if bad and math.isfinite(row.loss_init):
        ax.plot(
            bad,
            [row.loss_init] * len(bad),
            "x",
            color=style["color"],
            markersize=9,
            markeredgewidth=2,
            label="diverged seeds (at loss at init)",
        )
    if pd.notna(row.best_value):
        ax.plot(
            [row.best_value],
            [row.final_val_loss_mean],
            marker="*",
            color=style["color"],
            markersize=13,
            markeredgecolor="black",
            linestyle="none",
            label="each configuration's best value",
        )

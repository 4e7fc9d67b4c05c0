"""What the chart families draw with: figures of panels, a legend and a note for the whole figure,
seed-mean curves with their bands, the zoom on curves that end together, bars, and the runs a chart
keeps (completed, at the best value of the tuned key)."""

from __future__ import annotations

import math
import re
import textwrap

import pandas as pd
from matplotlib.figure import Figure

from normbench.report.charts.styles import coinciding, line_style
from normbench.report.load import ReportData
from normbench.report.metrics import metric


def _places(group: list[int]) -> list[tuple[int, int]]:
    """Per line of ``coinciding``'s groups: (its place k among the lines it coincides with, their
    number n), for line_style."""
    return [(group[:i].count(g), group.count(g)) for i, g in enumerate(group)]


def _draw_lines(ax, styles: dict, lines: dict, log: bool = False, note: bool = True, **kwargs) -> None:
    """One line per configuration (label -> y against x) in the one mapping; coinciding ones drawn
    thick to thin and named in a note in the panel's corner, so a reader knows why they look as one."""
    group, labels = coinciding(list(lines.values()), log), list(lines)
    for (label, y), (k, n) in zip(lines.items(), _places(group)):
        ax.plot(
            y.index,
            y.to_numpy(),
            **{"label": _plain(label), **line_style(styles[label], k, n, len(y)), **kwargs},
        )
    shared = [[labels[i] for i in range(len(labels)) if group[i] == g] for g in dict.fromkeys(group)]
    shared = [names for names in shared if len(names) > 1]
    if shared and note:  # a legend of text only: loc="best" puts it where it covers the fewest points
        text = (
            [f"all {len(labels)} configurations on one curve"]
            if len(shared[0]) == len(labels) > 2
            else [
                "on one curve (thick to thin): "
                + ", ".join(names[:4])
                + (f" and {len(names) - 4} more" if len(names) > 4 else "")
                for names in shared[:3]
            ]
            + ([f"and {len(shared) - 3} more groups of coinciding curves"] if len(shared) > 3 else [])
        )
        ax.legend(
            handles=[],
            title=_plain("\n".join(textwrap.fill(line, 60) for line in text)),
            title_fontsize="x-small",
            loc="best",
            framealpha=0.8,
        )


def _figure(n: int, width: float = 5.0, height: float = 3.8, ncols: int = 3):
    ncols = min(n, ncols)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(width * ncols + 1.5, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _legend(fig, axes) -> None:
    handles = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:  # as many columns as it takes for the legend to fit the figure's height
        ncols = math.ceil(len(handles) / max(4, int(fig.get_figheight() * 72 / 18)))  # ~18 pt a row
        # _figure keeps room for one column; each further one widens the figure rather than
        # squeezing the panels under the legend
        fig.set_figwidth(fig.get_figwidth() + 2.2 * (ncols - 1))
        fig.legend(handles.values(), handles.keys(), loc="outside right upper", fontsize="small", ncols=ncols)


def _note(fig, text: str) -> None:
    """A caveat under the whole figure, wrapped to its width."""
    if text:
        width = int(fig.get_figwidth() * 72 / 6.5)  # ~6.5 pt per character at the small font size
        width = math.ceil(len(text) / math.ceil(len(text) / width)) + 10  # lines of even length, no stub
        # a `command` stays on one line: its spaces become no-break spaces, which textwrap keeps
        text = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", "\u00a0"), text)
        fig.supxlabel(_plain(textwrap.fill(text, width)), fontsize="small", color="#a60", ha="center")


def _compared_norms(d: ReportData) -> list:
    """The norms the runs compare (two or more), else []."""
    norms = list(dict.fromkeys(d.runs["norm"].dropna()))
    return norms if "norm" in (d.keys or []) and len(norms) > 1 else []


def _plain(text) -> str:
    """A config value as literal chart text: two '$' in a label would otherwise start TeX math."""
    return str(text).replace("$", r"\$")


def _curves(d: ReportData, frame: pd.DataFrame, x: str, y: str) -> dict:
    """Per configuration present, best first: its mean over seeds against ``x`` with the min and max
    (columns mean, min, max) and its number of seeds."""
    frame = frame.dropna(subset=[x, y])
    frame = frame.assign(config=frame["run"].map(d.runs["config"]))
    stats = frame.groupby(["config", x])[y].agg(["mean", "min", "max"])  # one groupby for all configs
    seeds = frame.groupby("config")["run"].nunique()
    return {label: (stats.loc[label], seeds[label]) for label in d.agg["config"] if label in seeds.index}


def _bands(ax, d: ReportData, curves: dict, since: float | None = None, log: bool = False) -> None:
    """Per configuration: the mean over seeds as a line, min–max over seeds as a band (from ``since``
    on, when given)."""
    curves = {
        label: (s if since is None else s[s.index >= since], seeds) for label, (s, seeds) in curves.items()
    }
    _draw_lines(ax, d.styles, {label: s["mean"] for label, (s, _) in curves.items()}, log)
    for label, (s, seeds) in curves.items():
        if seeds > 1:
            ax.fill_between(
                s.index, s["min"], s["max"], color=d.styles[label]["color"], alpha=0.15, linewidth=0
            )


ZOOM_SHARE = 0.3  # the zoom panel shows the last 30% of the x axis, widened to hold ZOOM_POINTS
ZOOM_POINTS = 3  # the fewest points of each curve a zoom panel shows; a curve with fewer gets none


def zoom_window(curves: dict) -> tuple[float, tuple[float, float]] | None:
    """Where the curves end within a tenth of the range they span, the mean lines would read as one:
    the start of the last ZOOM_SHARE of the x axis, earlier where a curve has fewer than ZOOM_POINTS
    points after it (a validation curve of a few evaluations), and the y limits of the means there;
    else None."""
    if len(curves) < 2:
        return None
    means = [s["mean"] for s, _ in curves.values()]
    if any(len(m) < ZOOM_POINTS for m in means):
        return None
    ends = [m.iloc[-1] for m in means]
    span = max(m.max() for m in means) - min(m.min() for m in means)
    if not span > 0 or max(ends) - min(ends) >= 0.1 * span:
        return None
    lo, hi = min(m.index.min() for m in means), max(m.index.max() for m in means)
    since = min(hi - ZOOM_SHARE * (hi - lo), *(m.index[-ZOOM_POINTS] for m in means))
    tail = pd.concat([m[m.index >= since] for m in means])
    pad = 0.1 * (tail.max() - tail.min()) or 0.01 * abs(tail.max()) or 0.01
    return since, (tail.min() - pad, tail.max() + pad)


def _floor(ax, runs: pd.DataFrame) -> None:
    for i, floor in enumerate(sorted(pd.to_numeric(runs["floor_loss"], errors="coerce").dropna().unique())):
        ax.axhline(
            floor,
            color="black",
            linestyle=(0, (5, 3)),
            linewidth=1,
            label="synthetic floor (Bayes-optimal loss)" if i == 0 else None,
        )


def _bars(ax, d: ReportData, values: pd.Series, errs: list | None = None) -> None:
    """One bar per configuration in best-first order; ``errs`` holds one matplotlib yerr per bar."""
    for i, (label, value) in enumerate(zip(d.agg["config"], values)):
        if pd.notna(value):
            style = d.styles[label]
            ax.bar(
                i,
                value,
                yerr=None if errs is None else errs[i],
                capsize=3,
                color=style["color"],
                hatch=style["hatch"],
                edgecolor="black",
                linewidth=0.5,
            )
    ax.set_xticks(range(len(d.agg)), d.agg["config"].map(_plain), rotation=35, ha="right", fontsize="small")


def _completed(d: ReportData, frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["run"].isin(d.runs.index[d.runs["status"].eq("completed")])]


def metric_label(d: ReportData) -> str:
    """The compared metric as an axis label: 'final val loss (nats/token)'."""
    return metric(d.metric).axis()


def _at_best_note(d: ReportData) -> str:
    """What a title adds when _at_best filtered its runs."""
    return f"; each configuration at its best {d.tune}" if d.tune and d.tuned is not None else ""

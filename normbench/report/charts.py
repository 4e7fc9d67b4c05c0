"""Charts: one function per chart, registered with ``@chart(name, title)`` in display order.

A chart function takes the ``ReportData`` and returns a matplotlib ``Figure``, a string
saying why it was not drawn (its data is missing), or None when it belongs to an analysis these
runs were not asked for (the scale charts without a scale axis); ``run_report`` saves each as ``NAME.png``
(plus the other formats asked for) and embeds it in report.html. Adding a chart is one
decorated function here. Every chart uses one visual mapping: a colour per configuration, line
style / bar hatch = placement, marker = norm (when the runs all have one norm, the marker tells
apart the other group keys' values instead), and lines drawn so that coinciding curves stay
visible (``line_style``). With a size axis (--scale) each size is a shade of its configuration's
colour, darker as it grows, with a marker per size. The norm micro-benchmark, which has no
configurations, colours by norm.
"""

from __future__ import annotations

import math
import re
import textwrap
import zlib

import matplotlib
import matplotlib.colors
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from normbench.report.cost import LIMIT, implementation_note
from normbench.report.load import ReportData, layer_skip
from normbench.report.metrics import loss_unit, metric
from normbench.report.tables import _fmt_value
from normbench.report.tuning import at_best, tuned_configs

# Fixed colours for the registered norms (the micro-benchmark's lines) and, in this order, the
# registered norms' markers.
NORM_COLORS = {
    "ln": "C0",
    "rms": "C1",
    "bn": "C2",
    "gn": "C3",
    "scale": "C4",
    "dyt": "C5",
    "derf": "C6",
    "none": "C7",
}
EXTRA_COLORS = (
    "C8",
    "C9",
    "#393b79",
    "#8c6d31",
    "#637939",
    "#843c39",
)  # none of them a NORM_COLORS colour (C9 is #17becf)
# (line style, bar hatch) per placement; a placement not listed here gets one of EXTRA_STYLES by its name.
PLACEMENT_STYLES = {
    "pre": ("-", ""),
    "post": ("--", "//"),
    "peri": ("-.", ".."),
    "deepnorm": (":", "\\\\"),
    "lns": ((0, (5, 1)), "xx"),
    "mixln": ((0, (3, 1, 1, 1, 1, 1)), "++"),
    "reordered": ((0, (1, 1)), "--"),
    "hybrid": ((0, (6, 2)), "/."),
    "ngpt": ((0, (6, 2, 1, 2, 1, 2)), "\\||"),
}
EXTRA_STYLES = (((0, (8, 2, 1, 2)), "||"), ((0, (2, 2, 6, 2)), "**"), ((0, (4, 1, 1, 1, 1, 1, 1, 1)), "OO"))
MIXED_STYLE = ((0, (3, 1, 1, 1)), "oo")  # a configuration whose runs mix placements
IMPL_LINESTYLES = {"normbench": "-", "native": "--", "compiled": ":"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
# A fixed marker per registered norm, so a norm is marked the same in every chart and report.
NORM_MARKERS = dict(zip(NORM_COLORS, MARKERS))
# The configurations' colours, in order: tab10 (grey last: it reads as a reference line), then more.
PALETTE = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C8", "C9", *EXTRA_COLORS[2:], "C7")


def norm_marker(norm) -> str:
    return NORM_MARKERS.get(str(norm), MARKERS[zlib.crc32(str(norm).encode()) % len(MARKERS)])


def norm_color(norm) -> str:
    # crc32, not hash(): unknown norms must get the same colour in every process.
    return NORM_COLORS.get(str(norm), EXTRA_COLORS[zlib.crc32(str(norm).encode()) % len(EXTRA_COLORS)])


# (name, title, draw) in display order; RUN_CHARTS need run directories, the others do not.
CHARTS: list[tuple[str, str, object]] = []
RUN_CHARTS: set[str] = set()


def chart(name: str, title: str, needs_runs: bool = True):
    """Register a chart: ``draw(d: ReportData) -> Figure | str | None`` (the string: why not drawn;
    None: not for these runs, left out without a note)."""

    def register(draw):
        CHARTS.append((name, title, draw))
        if needs_runs:
            RUN_CHARTS.add(name)
        return draw

    return register


def make_styles(runs: pd.DataFrame, agg: pd.DataFrame, tune: str | None = None) -> dict:
    """One style per configuration: its own colour, a line style (and bar hatch) per placement and a
    marker per norm, so configurations whose curves coincide are still told apart by two of the three.

    Colours go to the configurations in a fixed order (the registered norms', then placements', then
    the other keys' values), not in the order of their results: ln/pre has the same colour in every
    report of the same configurations. The rows of one configuration at several values of the tuned
    key ``tune`` share its colour (the charts at each one's best value match the tuning chart's), and
    tell each other apart by the marker. When every configuration has the same norm, the marker goes
    to the other group keys' values instead ("n_layer=2", "warmup_steps=50"). No two rows share all
    three of colour, line style and marker.
    """
    # norm/placement need not be group keys: a config mixing several gets the "mixed" style.
    names = (
        runs.groupby("config", sort=False)[["norm", "placement"]]
        .agg(lambda s: s.iloc[0] if s.nunique(dropna=False) == 1 else "mixed")
        .reindex(agg["config"])
    )
    tuned = () if tune is None else (tune + "=", tune.rsplit(".", 1)[-1] + "=")
    rests = [
        " ".join(t for t in str(label).split(" ") if "=" in t and not t.startswith(tuned))
        for label in agg["config"]
    ]
    one_norm = names["norm"].nunique(dropna=False) == 1
    by_rest = sorted(set(rests))
    norm_order, placement_order = list(NORM_MARKERS), list(PLACEMENT_STYLES)

    def rank(label, norm, placement, rest):
        return (
            norm_order.index(norm) if norm in norm_order else len(norm_order),
            str(norm),
            placement_order.index(placement) if placement in placement_order else len(placement_order),
            str(placement),
            rest,
            str(label),
        )

    rows = sorted(zip(agg["config"], names["norm"], names["placement"], rests), key=lambda r: rank(*r))
    families = list(dict.fromkeys((str(norm), str(placement), rest) for _, norm, placement, rest in rows))
    styles, used = {}, set()
    for label, norm, placement, rest in rows:
        linestyle, hatch = placement_style(placement)
        marker = MARKERS[by_rest.index(rest) % len(MARKERS)] if one_norm else norm_marker(norm)
        color = PALETTE[families.index((str(norm), str(placement), rest)) % len(PALETTE)]
        # a tuned configuration's other values, or a colour come round again: the marker keeps the
        # triple unique
        for _ in range(len(MARKERS)):
            if (color, str(linestyle), marker) not in used:
                break
            marker = MARKERS[(MARKERS.index(marker) + 1) % len(MARKERS)]
        used.add((color, str(linestyle), marker))
        styles[label] = dict(color=color, linestyle=linestyle, hatch=hatch, marker=marker)
    return styles


def line_style(style: dict, k: int = 0, n: int = 1, points: int = 0) -> dict:
    """``ax.plot`` keywords for a configuration's line, the ``k``-th drawn of ``n`` that coincide.

    Coinciding curves must not hide each other: the first is drawn thick and each later one thinner,
    with smaller markers, so every colour shows (a thin line inside a thick one); with ``points``
    (a long curve) the markers sit every few points, each configuration's at its own ones.
    """
    share = k / max(1, n - 1)
    # a marker every `every` points, one slot per coinciding configuration; too few points for that: all
    every = max(n, points // 8) if points >= 2 * n else 1
    return dict(
        color=style["color"],
        linestyle=style["linestyle"],
        linewidth=3.6 - 2.4 * share if n > 1 else 1.8,
        marker=style["marker"],
        markersize=8.5 - 4.0 * share if n > 1 else 6.0,
        markevery=(k % every, every) if points else None,
    )


COINCIDE = 0.02  # curves closer than this share of the axis' span over most points read as one


def coinciding(lines: list[pd.Series], log: bool = False) -> list[int]:
    """Per line (y against x, in drawing order): the first line it coincides with (itself when none),
    so equal numbers mark one group. On a log axis the distance is in decades."""
    values = [np.log10(y.where(y > 0)) if log else y for y in lines]
    finite = pd.concat(values).replace([np.inf, -np.inf], np.nan).dropna() if values else pd.Series()
    span = finite.max() - finite.min() if len(finite) else 0.0

    def close(a: pd.Series, b: pd.Series) -> bool:
        common = a.index.intersection(b.index)
        if not len(common) or len(common) < 0.8 * max(len(a), len(b)):
            return False
        gap = (a[common] - b[common]).abs().dropna()
        return len(gap) > 0 and gap.quantile(0.9) <= COINCIDE * span

    group = []
    for i, v in enumerate(values):
        group.append(next((j for j in range(i) if group[j] == j and close(v, values[j])), i))
    return group


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


def size_styles(d: ReportData) -> dict:
    """With a size axis: each configuration keeps its colour and line style, each size gets a shade
    of that colour (light for the smallest, full for the largest) and a marker of its own, so
    the sizes of one configuration can be told apart in every chart."""
    s = d.scale
    base = _scale_styles(d)
    sizes = sorted(s.table[s.key].unique())
    styles = dict(d.styles)
    for label, config, size in zip(d.runs["config"], s.run_config, pd.to_numeric(d.runs[s.key])):
        rank = sizes.index(size)
        light = 0.65 * (1 - rank / max(1, len(sizes) - 1))  # the share of white mixed in
        rgb = np.array(matplotlib.colors.to_rgb(base[config]["color"]))
        styles[label] = dict(
            base[config],
            color=tuple(rgb * (1 - light) + light),
            marker=MARKERS[rank % len(MARKERS)],
        )
    return styles


def placement_style(placement) -> tuple:
    """The (line style, hatch) that marks a placement in every chart."""
    name = str(placement)
    if name in PLACEMENT_STYLES:
        return PLACEMENT_STYLES[name]
    return MIXED_STYLE if name == "mixed" else EXTRA_STYLES[zlib.crc32(name.encode()) % len(EXTRA_STYLES)]


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


ZOOM_SHARE = 0.3  # the zoom panel shows the last 30% of the x axis


def zoom_window(curves: dict) -> tuple[float, tuple[float, float]] | None:
    """Where the curves end within a tenth of the range they span, the mean lines would read as one:
    the start of the last ZOOM_SHARE of the x axis and the y limits of the means there; else None."""
    if len(curves) < 2:
        return None
    means = [s["mean"] for s, _ in curves.values()]
    ends = [m.iloc[-1] for m in means]
    span = max(m.max() for m in means) - min(m.min() for m in means)
    if not span > 0 or max(ends) - min(ends) >= 0.1 * span:
        return None
    lo, hi = min(m.index.min() for m in means), max(m.index.max() for m in means)
    since = hi - ZOOM_SHARE * (hi - lo)
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
            title=f"{title}, the last {ZOOM_SHARE:.0%} zoomed\n(the ends lie within a tenth of the range)",
            xlabel=xlabel,
            ylabel=f"loss ({loss_unit(d.metric)})",
            ylim=ylim,
        )
        ax.grid(alpha=0.3)
    fig.suptitle(f"Loss curves: mean over seeds, band = min–max (completed runs only{_at_best_note(d)})")
    _legend(fig, axes)
    return fig


def metric_label(d: ReportData) -> str:
    """The compared metric as an axis label: 'final val loss (nats/token)'."""
    return metric(d.metric).axis()


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
        ax.plot(
            i + np.asarray(offsets),
            part.sort_values("seed")["_value"],
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
    """Per value of the tuned key: (value, mean final loss over completed seeds, its CI, seeds not
    completed)."""
    points = []
    for value, at in group.groupby("_value"):
        done = at.loc[at["status"].eq("completed"), "final_val_loss"].dropna()
        points.append((value, done.mean() if len(done) else math.nan, mean_ci(done), len(at) - len(done)))
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
    # diverged or failed seeds: an x at the loss at init, where the sensitivity counts them
    bad = [p[0] for p in points if p[3]]
    if bad and math.isfinite(row.loss_init):
        ax.plot(
            bad,
            [row.loss_init] * len(bad),
            "x",
            color=style["color"],
            markersize=9,
            markeredgewidth=2,
            label="diverged or failed seeds (at loss at init)",
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


def _scale_styles(d: ReportData) -> dict:
    """The scale axis's configurations (no size, no tuned value in their labels) in the one mapping."""
    return make_styles(d.runs.assign(config=d.scale.run_config), pd.DataFrame({"config": d.scale.configs}))


def _size_chart(fig, ax, s, ylabel: str, title: str):
    """A one-panel scale chart finished: a log2 x-axis at the sizes' parameters (or tokens),
    labelled with the size key's values; labels, grid, legend."""
    at = s.table.groupby(s.key)["x"].first()
    ax.set_xscale("log", base=2)
    below = "" if s.x == s.key else f" (below: the size's {s.x})"
    ax.set_xticks(
        at.to_numpy(float), [_fmt_value(k) + ("" if s.x == s.key else f"\n{x:,.0f}") for k, x in at.items()]
    )
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set(xlabel=_plain(s.key + below), ylabel=_plain(ylabel), title=_plain(title))
    ax.grid(alpha=0.3)
    _legend(fig, [ax])
    return fig


def _scale_or_why(d: ReportData, without_tune: str | None = None):
    """The scale axis, why a scale chart is not drawn (``without_tune``: the reason when nothing is
    tuned), or None without a scale axis: a report that compares no sizes has no scale charts."""
    if d.scale is None:
        return None
    return without_tune if without_tune and not d.tune else d.scale


@chart("scale_gap", "Difference to the baseline against size")
def chart_scale_gap(d: ReportData):
    s = _scale_or_why(d)
    if s is None or isinstance(s, str):
        return s
    others = [c for c in s.configs if c != s.baseline]
    if not others:
        return "one configuration: nothing to compare with the baseline"
    styles, trend = _scale_styles(d), s.trend.set_index("config")
    fig, (ax,) = _figure(1, width=8.0, height=5.0)
    ax.axhline(0.0, color="black", linewidth=1, label=_plain(f"baseline: {s.baseline}"))
    for config in others:
        part, style = (
            s.table[s.table["config"].eq(config)].dropna(subset=["diff_vs_baseline"]),
            styles[config],
        )
        ax.plot(
            part["x"],
            part["diff_vs_baseline"],
            color=style["color"],
            linestyle=style["linestyle"],
            marker=style["marker"] or "o",
            markersize=5,
            label=_plain(f"{config} ({trend.at[config, 'trend']})"),
        )
        band = part.dropna(subset=["diff_ci_low"])
        ax.fill_between(
            band["x"],
            band["diff_ci_low"],
            band["diff_ci_high"],
            color=style["color"],
            alpha=0.15,
            linewidth=0,
        )
        fitted = part.dropna(subset=["diff_se"])
        if pd.notna(trend.at[config, "slope_per_doubling"]):  # the WLS line over the sizes it was fitted on
            ax.plot(
                [fitted["x"].min(), fitted["x"].max()],
                [trend.at[config, "fitted_first"], trend.at[config, "fitted_last"]],
                color=style["color"],
                linestyle=":",
                linewidth=2.5,
                alpha=0.7,
                label="fitted trend (least squares)",
            )
    return _size_chart(
        fig,
        ax,
        s,
        f"final val loss - {s.baseline}'s (positive: worse)",
        f"Difference to {s.baseline} at each size\n(each at its best value; band = 95% CI,\n"
        f"paired by seed; dotted = the fitted trend)",
    )


@chart("scale_best_value", "Best value of the tuned key against size")
def chart_scale_best_value(d: ReportData):
    s = _scale_or_why(d, "no tuning key: no best value per size")
    if s is None or isinstance(s, str):
        return s
    styles, trend = _scale_styles(d), s.trend.set_index("config")
    fig, (ax,) = _figure(1, width=8.0, height=5.0)
    # later lines thinner: configurations with the same best stay visible
    for i, config in enumerate(s.configs):
        part, style = s.table[s.table["config"].eq(config)].dropna(subset=["best_value"]), styles[config]
        drift = trend.at[config, "best_drift_half_decades"]
        ax.plot(
            part["x"],
            part["best_value"],
            color=style["color"],
            linestyle=style["linestyle"],
            marker=style["marker"] or "o",
            markersize=max(3, 10 - 2 * i),
            linewidth=max(1.0, 3.0 - 0.5 * i),
            label=_plain(config + ("" if pd.isna(drift) else f" (drift {drift:+.1f} half-decades)")),
        )
    grid = sorted(pd.to_numeric(d.runs[d.tune], errors="coerce").dropna().unique())
    if grid and grid[0] > 0:
        ax.set_yscale("log")
    ax.set_yticks(grid, [f"{v:g}" for v in grid])
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    return _size_chart(
        fig,
        ax,
        s,
        f"best {d.tune} (ticks: the swept grid)",
        f"Best {d.tune} at each size\n(lowest mean final loss over completed seeds)",
    )


@chart("predict", "Each configuration's fitted law and the prediction beyond the grid")
def chart_predict(d: ReportData):
    s, pred = d.scale, d.predict
    if s is None or pred is None:
        return None  # no prediction asked for (--predict)
    styles = _scale_styles(d)
    fig, axes = _figure(2, width=6.0, height=4.6, ncols=2)
    targets = sorted(pred["target"].unique())
    grid = np.geomspace(s.table["x"].min(), max(targets[-1], s.table["x"].max()), 200)
    fitted, drawn = [], set()
    for k, config in enumerate(s.configs):
        style, part = styles[config], s.table[s.table["config"].eq(config)]
        rows = pred[pred["config"].eq(config)]
        law = rows.iloc[0]
        # configurations side by side at each size (8% apart on the log axis), each marker edged,
        # so points of equal loss do not hide one another
        shift = 1.08 ** (k - (len(s.configs) - 1) / 2)
        marks = dict(
            color=style["color"], marker=style["marker"], markeredgecolor="black", markeredgewidth=0.6
        )
        mean = part["final_val_loss_mean"]
        axes[0].errorbar(
            part["x"] * shift,
            mean,
            yerr=[(mean - part["ci_low"]).fillna(0), (part["ci_high"] - mean).fillna(0)],
            linestyle="none",
            capsize=3,
            label=_plain(config),
            **marks,
        )
        if np.isfinite(law["alpha"]):
            fitted.append(config)
            axes[0].plot(
                grid,
                law["E"] + law["A"] * grid ** -law["alpha"],
                color=style["color"],
                linestyle=style["linestyle"],
                label=_plain(f"{config}: {law['E']:.3f} + {law['A']:.3g} x^-{law['alpha']:.3f}"),
            )
        for ax, y, low, high, what in (
            (axes[0], "loss_pred", "loss_ci_low", "loss_ci_high", "loss"),
            (axes[1], "gap_pred", "gap_ci_low", "gap_ci_high", "gap"),
        ):
            shown = rows.dropna(subset=[y, low])
            if (config == s.baseline and what == "gap") or shown.empty:
                continue
            drawn.add(what)
            ax.errorbar(
                shown["target"] * shift,
                shown[y],
                yerr=[shown[y] - shown[low], shown[high] - shown[y]],
                color=style["color"],
                marker="D",
                markerfacecolor="white",
                markeredgecolor=style["color"],
                linestyle="none",
                capsize=4,
            )
        if config != s.baseline:
            measured = part.dropna(subset=["diff_vs_baseline"])
            axes[1].plot(
                measured["x"] * shift, measured["diff_vs_baseline"], linestyle=style["linestyle"], **marks
            )
            band = measured.dropna(subset=["diff_ci_low"])
            axes[1].fill_between(
                band["x"], band["diff_ci_low"], band["diff_ci_high"], color=style["color"], alpha=0.15, lw=0
            )
    axes[1].axhline(0.0, color="black", linewidth=1)
    largest = s.table["x"].max()
    unit = {"params": "parameters", "tokens": "training tokens"}.get(s.x, s.key)
    for ax, ylabel, title in (
        (
            axes[0],
            f"{metric_label(d)} at each best value",
            "Measured loss" + ", fitted law" * bool(fitted) + ", prediction" * ("loss" in drawn),
        ),
        (
            axes[1],
            f"{metric(d.metric).header} - {s.baseline}'s",
            f"Gap to {s.baseline}: measured" + ", predicted" * ("gap" in drawn),
        ),
    ):
        ax.axvline(largest, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set(xlabel=_plain(f"{unit} (dotted: the largest size measured)"), ylabel=_plain(ylabel))
        ax.set_title(_plain(title))
        ax.grid(alpha=0.3)
    failed = [c for c in s.configs if c not in fitted]
    lines = [
        "filled markers: measured mean at each size (95% CI), configurations side by side",
        "lines: L = E + A x^-alpha fitted per configuration" if fitted else "",
        f"no power law converged for {', '.join(failed)}: no fitted line" if failed else "",
        "open diamonds: the prediction with its 95% interval" if drawn else "",
    ]
    fig.suptitle(_plain("\n".join(line for line in lines if line)))
    _legend(fig, axes)
    return fig


@chart("scale_tuning", "Final loss against the tuned key, one panel per size")
def chart_scale_tuning(d: ReportData):
    """Wortsman et al.'s Fig. 1 at each size: how the LR curve moves as the model grows."""
    s = _scale_or_why(d, "no tuning key: one value per size")
    if s is None or isinstance(s, str):
        return s
    from normbench.report.stats import mean_ci

    runs = d.runs.assign(
        _value=pd.to_numeric(d.runs[d.tune], errors="coerce"),
        _config=s.run_config,
        _size=pd.to_numeric(d.runs[s.key], errors="coerce"),
    )
    styles, sizes = _scale_styles(d), sorted(s.table[s.key].unique())
    fig, axes = _figure(len(sizes), width=4.8, height=4.0, ncols=4)
    finite = []
    for ax, size in zip(axes, sizes):
        notes = []
        for config in s.configs:
            at = runs[runs["_config"].eq(config) & runs["_size"].eq(size)]
            row = s.table[s.table["config"].eq(config) & s.table[s.key].eq(size)]
            if at.empty or row.empty:
                continue
            points = _tuning_points(at, mean_ci)
            r = row.iloc[0]
            # the sensitivity goes in the panel's note: in the label it would split a configuration's legend
            # entry
            mark = pd.Series(
                {
                    "config": config,
                    "lr_sensitivity": math.nan,
                    "best_value": r["best_value"],
                    "final_val_loss_mean": r["final_val_loss_mean"],
                    "loss_init": at["init_val_loss"].mean(),
                }
            )
            _tuning_curve(ax, mark, points, styles[config])
            _tuning_marks(ax, mark, points, styles[config])
            if pd.notna(r["lr_sensitivity"]):
                notes.append(f"{config} {r['lr_sensitivity']:.3f}")
            finite += [
                v
                for p in points
                for v in (p[1], *((p[2].low, p[2].high) if p[2] else ()))
                if math.isfinite(v)
            ]
        values = runs["_value"].dropna()
        if len(values) and (values > 0).all() and values.max() / values.min() >= 10:
            ax.set_xscale("log")
        ax.set(
            title=_plain(f"{s.key}={_fmt_value(size)}"),
            xlabel=_plain(d.tune),
            ylabel=metric_label(d),
        )
        if notes:
            ax.text(
                0.02,
                0.98,
                _plain("sensitivity:\n" + "\n".join(notes)),
                transform=ax.transAxes,
                va="top",
                fontsize="x-small",
                bbox=dict(facecolor="white", alpha=0.8, linewidth=0),
            )
        ax.grid(alpha=0.3, which="both")
    if finite:  # one y range for every panel, so the curves' heights compare across sizes
        span = max(finite) - min(finite) or 0.1
        for ax in axes:
            ax.set_ylim(min(finite) - 0.08 * span, max(finite) + 0.08 * span)
    fig.suptitle(
        _plain(
            f"Final validation loss against {d.tune} at each {s.key}\n(mean over completed seeds, "
            f"band = 95% CI, * = best value,\n× = diverged seeds, drawn at the loss at init)"
        )
    )
    _legend(fig, axes)
    return fig


def _at_best_note(d: ReportData) -> str:
    """What a title adds when _at_best filtered its runs."""
    return f"; each configuration at its best {d.tune}" if d.tune and d.tuned is not None else ""


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


@chart("throughput", "Throughput, step time and memory")
def chart_throughput(d: ReportData):
    agg = d.agg
    panels = [
        ("tokens_per_s_mean", None, "Throughput", "tokens/s"),
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
    fig.suptitle("Speed and memory per configuration (mean over runs)")
    norms = _compared_norms(d)
    if norms:
        _note(fig, implementation_note(d.bench, norms))
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

"""The one visual mapping every chart uses: a colour per configuration, line style / bar hatch =
placement, marker = norm (when the runs all have one norm, the marker tells apart the other group
keys' values instead), and line widths and dashes that keep coinciding curves visible
(``line_style``). With a size axis (--scale) each size is a shade of its configuration's colour,
darker as it grows, with a marker per size (``size_styles``). The norm micro-benchmark, which has no
configurations, colours by norm (``norm_color``)."""

from __future__ import annotations

import zlib

import matplotlib.colors
import numpy as np
import pandas as pd

from normbench.report.load import ReportData

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


def _scale_styles(d: ReportData) -> dict:
    """The scale axis's configurations (no size, no tuned value in their labels) in the one mapping."""
    return make_styles(d.runs.assign(config=d.scale.run_config), pd.DataFrame({"config": d.scale.configs}))

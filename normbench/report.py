"""Reports: turn run directories (and bench CSVs) into tables, charts and one HTML page.

This module owns everything behind ``normbench report``: finding runs below the given
paths, reading each run's config.yaml / metrics.jsonl / summary.json once, the per-run
table (summary.csv), the per-configuration table (aggregate.csv, summary.md, the rich
terminal table), the charts, and a self-contained report.html.

One rule runs through it: loss statistics average *completed* runs only. Diverged and
failed runs are counted in their own columns and marked on the charts, never averaged in.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import yaml
from matplotlib.figure import Figure
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from normbench.errors import ConfigError
from normbench.runs import read_jsonl, write_atomic

# Metrics a report can be sorted by; the first three are losses (lower is better).
METRICS = ("final_val_loss", "best_val_loss", "floor_gap", "tokens_per_s", "step_ms_p50", "step_ms_p90",
           "peak_mem_mb", "mfu", "wall_s", "max_grad_norm", "clip_fraction")
HIGHER_IS_BETTER = {"tokens_per_s", "mfu"}
LOSS_FIELDS = ("final_val_loss", "best_val_loss", "floor_gap")
SPEED_FIELDS = ("tokens_per_s", "step_ms_p50", "step_ms_p90", "peak_mem_mb")
FORMATS = ("png", "svg", "pdf")
BENCH_COLUMNS = ("norm", "impl", "dim", "dtype", "device", "pass", "ms")
ALIASES = {"norm.name": "norm", "placement.name": "placement"}

# The one visual mapping every chart uses: colour = norm, line style / hatch = placement.
# Fixed colours for the registered norms so a norm looks the same in every report.
NORM_COLORS = {"ln": "C0", "rms": "C1", "bn": "C2", "gn": "C3", "scale": "C4", "dyt": "C5", "none": "C7"}
EXTRA_COLORS = ("C6", "C8", "C9", "#17becf", "#393b79", "#8c6d31")
PLACEMENT_STYLES = {"pre": ("-", ""), "post": ("--", "//"), "peri": ("-.", ".."), "deepnorm": (":", "\\\\")}
IMPL_LINESTYLES = {"normbench": "-", "native": "--", "compiled": ":"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
DPI = 100


def norm_color(norm) -> str:
    # crc32, not hash(): unknown norms must get the same colour in every process.
    return NORM_COLORS.get(str(norm), EXTRA_COLORS[zlib.crc32(str(norm).encode()) % len(EXTRA_COLORS)])


# ----------------------------------------------------------------------------- reading


def find_inputs(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """Run directories (any directory holding config.yaml) below ``paths``, and bench CSVs."""
    run_dirs, bench_csvs = [], []
    for path in paths:
        if not path.exists():
            raise ConfigError(f"path does not exist: {path}", allowed=["a run or sweep directory", "a bench .csv file"])
        if path.is_file():
            if path.suffix.lower() != ".csv":
                raise ConfigError(f"{path} is a file but not a bench CSV",
                                  allowed=["a run or sweep directory", "a bench .csv file"])
            bench_csvs.append(path)
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # .hydra/ holds a config.yaml too
            if "config.yaml" in files:
                run_dirs.append(Path(root))
    unique = {d.resolve(): d for d in run_dirs}  # overlapping input paths must not count a run twice
    return list(unique.values()), bench_csvs


def flatten(tree: dict, prefix: str = "") -> dict:
    """Nested dict -> {"a.b.c": value}; lists become JSON strings so they can be grouped on."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        elif isinstance(value, (list, tuple)):
            flat[name] = json.dumps(value, default=str)
        else:
            flat[name] = value
    return flat


def _num(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def load_run(run_dir: Path, warn) -> tuple[dict, dict, list[dict]] | None:
    """(config, summary, metric records) of one run, or None (with a warning) if it cannot be used."""
    if not (run_dir / "summary.json").exists():
        warn(f"skipped {run_dir}: no summary.json (still running or killed)")
        return None
    if not (run_dir / "metrics.jsonl").exists():
        warn(f"skipped {run_dir}: no metrics.jsonl")
        return None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        config = yaml.load((run_dir / "config.yaml").read_text(), Loader=loader)
        if not isinstance(config, dict):
            raise ValueError("not a mapping")
    except (OSError, ValueError, yaml.YAMLError) as e:
        warn(f"skipped {run_dir}: unreadable config.yaml ({e})")
        return None
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        if not isinstance(summary, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        warn(f"skipped {run_dir}: corrupt summary.json ({e})")
        return None
    try:
        records = read_jsonl(run_dir / "metrics.jsonl", warn)
    except (OSError, ValueError) as e:
        warn(f"skipped {run_dir}: unreadable metrics.jsonl ({e})")
        return None
    return config, summary, records


@dataclass
class ReportData:
    runs: pd.DataFrame  # one row per run: summary.csv
    config_keys: list[str]  # dotted config keys, in first-seen order
    train: pd.DataFrame  # run, step, tokens, train_loss
    evals: pd.DataFrame  # run, step, val_loss
    grads: pd.DataFrame  # run, step, grad_norm (global, from stats records)
    layers: pd.DataFrame  # run, when ("first"/"last" stats record), step, layer, grad (mlp_out), resid_rms
    bench: pd.DataFrame | None = None
    keys: list[str] | None = None  # group keys
    agg: pd.DataFrame | None = None  # one row per configuration, best first: aggregate.csv
    styles: dict | None = None  # config label -> matplotlib line/bar style


def load_runs(run_dirs: list[Path], warn) -> ReportData:
    rows, train, evals, grads, layers, config_keys = [], [], [], [], [], {}
    for run_dir in run_dirs:
        loaded = load_run(run_dir, warn)
        if loaded is None:
            continue
        config, summary, records = loaded
        run = len(rows)
        flat_config = flatten(config)
        config_keys.update(dict.fromkeys(flat_config))
        status = summary.get("status")
        if not status:  # runs older than the status field: a finite final loss means it finished
            status = "completed" if math.isfinite(_num(summary.get("final_val_loss"))) else "unknown"
        norm, placement = config.get("norm"), config.get("placement")
        rows.append({
            **flatten({k: v for k, v in summary.items() if k != "status"}),
            **flat_config,
            # last, so that no config or summary key can shadow the short columns
            "run_dir": str(run_dir),
            "norm": norm.get("name") if isinstance(norm, dict) else norm,
            "placement": placement.get("name") if isinstance(placement, dict) else placement,
            "seed": config.get("seed"),
            "status": status,
        })
        stats = []
        for r in records:
            kind = r.get("kind")
            if kind == "train":
                train.append((run, _num(r.get("step")), _num(r.get("tokens")), _num(r.get("train_loss"))))
            elif kind == "eval":
                evals.append((run, _num(r.get("step")), _num(r.get("val_loss"))))
            elif kind == "stats":
                grads.append((run, _num(r.get("step")), _num(r.get("grad_norm"))))
                if isinstance(r.get("layers"), list) and r["layers"]:
                    stats.append(r)
        # Only the first and last per-layer snapshots are drawn; keep nothing else.
        for when, r in ([("first", stats[0]), ("last", stats[-1])] if stats else []):
            for i, layer in enumerate(r["layers"]):
                layer = layer if isinstance(layer, dict) else {}
                grad = layer.get("grad_norm") if isinstance(layer.get("grad_norm"), dict) else {}
                layers.append((run, when, _num(r.get("step")), i,
                               _num(grad.get("mlp_out")), _num(layer.get("resid_rms"))))
    runs = pd.DataFrame(rows)
    for col in ("run_dir", "norm", "placement", "seed", "status", "floor_loss", "leaks_future", *METRICS):
        if col not in runs:
            runs[col] = np.nan
    for col in METRICS:
        runs[col] = pd.to_numeric(runs[col], errors="coerce")
    runs["floor_gap"] = runs["final_val_loss"] - pd.to_numeric(runs["floor_loss"], errors="coerce")
    first = ["run_dir", "norm", "placement", "seed", "status", *METRICS]
    runs = runs[first + [c for c in runs.columns if c not in first]]
    return ReportData(
        runs=runs, config_keys=list(config_keys),
        train=pd.DataFrame(train, columns=["run", "step", "tokens", "train_loss"]),
        evals=pd.DataFrame(evals, columns=["run", "step", "val_loss"]),
        grads=pd.DataFrame(grads, columns=["run", "step", "grad_norm"]),
        layers=pd.DataFrame(layers, columns=["run", "when", "step", "layer", "grad", "resid_rms"]),
    )


def read_bench(paths: list[Path]) -> pd.DataFrame | None:
    frames = []
    for path in paths:
        try:
            frame = pd.read_csv(path)
        except (OSError, ValueError) as e:  # pandas' EmptyDataError/ParserError are ValueErrors
            raise ConfigError(f"cannot read bench CSV {path}: {e}") from None
        missing = [c for c in BENCH_COLUMNS if c not in frame]
        if missing:
            raise ConfigError(f"{path} is not a bench CSV (missing columns {', '.join(missing)})",
                              allowed=BENCH_COLUMNS)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else None


# ----------------------------------------------------------------------------- tables


def _is_bookkeeping(key: str) -> bool:
    """Config keys that vary between runs without defining a configuration (seeds, paths)."""
    last = key.rsplit(".", 1)[-1]
    return (key.startswith("hydra.") or last == "seed" or last in ("out", "output")
            or last.endswith(("dir", "path", "file")))


def default_group_keys(runs: pd.DataFrame, config_keys: list[str]) -> list[str]:
    """The config keys that actually vary across runs, norm and placement first."""
    varying = [ALIASES.get(k, k) for k in config_keys
               if not _is_bookkeeping(k) and runs[k].nunique(dropna=False) > 1]
    keys = [k for k in ("norm", "placement") if k in varying] + [k for k in varying if k not in ("norm", "placement")]
    # norm.eps, placement.final_norm, ... that merely follow the norm/placement name split no
    # group further; keeping them would only clutter every label.
    for short in ("norm", "placement"):
        if short in keys:
            keys = [k for k in keys if not (k.startswith(short + ".") and
                                            runs.groupby(short, dropna=False)[k].nunique(dropna=False).max() <= 1)]
    return keys or ["norm", "placement"]


def resolve_group_keys(group_by: list[str] | None, data: ReportData) -> list[str]:
    if not group_by:
        return default_group_keys(data.runs, data.config_keys)
    allowed = ["norm", "placement", *[k for k in data.config_keys if k not in ALIASES]]
    keys = []
    for key in group_by:
        key = ALIASES.get(key.strip(), key.strip())
        if key not in allowed:
            raise ConfigError(f"unknown group key {key!r}", allowed=allowed)
        keys += [key] if key not in keys else []
    return keys


def _fmt_value(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))  # a column with a missing value turns ints into floats
    return str(value)


def config_label(keys: list[str], values) -> str:
    """'ln/pre lr=0.003' for the group keys of one configuration."""
    values = dict(zip(keys, values))
    head = "/".join(_fmt_value(values[k]) for k in ("norm", "placement") if k in values)
    short = [k.rsplit(".", 1)[-1] for k in keys]
    rest = [f"{s if short.count(s) == 1 else k}={_fmt_value(values[k])}"
            for k, s in zip(keys, short) if k not in ("norm", "placement")]
    return " ".join([head] * bool(head) + rest)


def aggregate(runs: pd.DataFrame, keys: list[str], metric: str = "final_val_loss") -> pd.DataFrame:
    """One row per configuration (the group keys), best first by ``metric``.

    Loss mean/std/count use completed runs only (std is the sample std, ddof=1); diverged and
    failed runs are counted separately. Throughput and memory average every run that reported
    them: a diverged run's speed is still a real measurement.
    """
    status = runs["status"]
    flags = runs.assign(runs=1, completed=status.eq("completed"), diverged=status.eq("diverged"),
                        failed=status.eq("failed"), leaks_future=runs["leaks_future"].map(
                            lambda v: bool(v) if isinstance(v, (bool, np.bool_)) else pd.NA))
    groups = flags.groupby(keys, dropna=False, sort=False)
    agg = groups[["runs", "completed", "diverged", "failed"]].sum()
    completed = runs[status.eq("completed")].groupby(keys, dropna=False, sort=False)
    losses = completed[list(LOSS_FIELDS)].agg(["mean", "std", "count"])
    losses.columns = [f"{field}_{stat}" for field, stat in losses.columns]
    speed_fields = list(dict.fromkeys(f for f in (*SPEED_FIELDS, metric) if f not in LOSS_FIELDS))
    agg = agg.join(losses).join(groups[speed_fields].mean().add_suffix("_mean"))
    agg["leaks_future"] = groups["leaks_future"].agg(lambda s: bool(s.dropna().any()) if s.notna().any() else pd.NA)
    for col in [c for c in agg.columns if c.endswith("_count")]:
        agg[col] = agg[col].fillna(0).astype(int)  # a group whose runs all diverged has no completed losses
    agg = agg.reset_index()
    agg = agg.sort_values(f"{metric}_mean", ascending=metric not in HIGHER_IS_BETTER, na_position="last", kind="stable")
    agg.insert(0, "config", [config_label(keys, v) for v in agg[keys].itertuples(index=False)])
    return agg.reset_index(drop=True)


def display_table(agg: pd.DataFrame, keys: list[str], metric: str) -> pd.DataFrame:
    """The aggregate as short strings: one formatting for the terminal, Markdown and HTML."""
    def pm(row, field):
        mean, std, n = row[f"{field}_mean"], row[f"{field}_std"], row[f"{field}_count"]
        if pd.isna(mean):
            return "–"
        return f"{mean:.3f}" + (f" ± {std:.3f}" if n > 1 else "") + f" (n={n})"

    def num(value, spec):
        return "–" if pd.isna(value) else format(value, spec)

    table = pd.DataFrame({k: agg[k].map(_fmt_value) for k in keys})
    table["runs"] = agg["runs"].astype(str)
    table["final val loss"] = [pm(r, "final_val_loss") for _, r in agg.iterrows()]
    table["best val loss"] = [pm(r, "best_val_loss") for _, r in agg.iterrows()]
    table["gap to floor"] = agg["floor_gap_mean"].map(lambda v: num(v, ".3f"))
    table["tokens/s"] = agg["tokens_per_s_mean"].map(lambda v: num(v, ",.0f"))
    table["step ms (p50)"] = agg["step_ms_p50_mean"].map(lambda v: num(v, ".1f"))
    table["peak MB"] = agg["peak_mem_mb_mean"].map(lambda v: num(v, ",.0f"))
    if f"{metric}_std" not in agg and metric not in SPEED_FIELDS:
        table[metric] = agg[f"{metric}_mean"].map(lambda v: num(v, ".4g"))
    table["diverged"] = agg["diverged"].astype(str)
    table["failed"] = agg["failed"].astype(str)
    if agg["leaks_future"].notna().any():
        table["leaks future"] = agg["leaks_future"].map(lambda v: "–" if pd.isna(v) else ("yes" if v else "no"))
    return table


def to_markdown(table: pd.DataFrame) -> str:
    cell = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(cell, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"


# Left out of the terminal table when it would not fit; the CSV, Markdown and HTML keep them.
SECONDARY_COLUMNS = ("best val loss", "step ms (p50)", "peak MB")


def print_table(console: Console, table: pd.DataFrame, title: str, n_keys: int) -> None:
    quiet = [c for c in ("diverged", "failed", "leaks future") if c in table and set(table[c]) <= {"0", "no"}]
    table = table.drop(columns=quiet)  # all-zero columns say nothing a person needs to read
    if console.width < 40 + 14 * len(table.columns):
        table = table.drop(columns=[c for c in SECONDARY_COLUMNS if c in table])
    rich_table = Table(title=title)
    for i, col in enumerate(table.columns):
        rich_table.add_column(col, justify="left" if i < n_keys else "right")
    for row in table.itertuples(index=False):
        # Text(), not str: a config value like "[bold]" must not be read as rich markup.
        rich_table.add_row(*(Text(v, style="red" if col in ("diverged", "failed") and v != "0" else "")
                             for col, v in zip(table.columns, row)))
    console.print(rich_table)


# ----------------------------------------------------------------------------- charts


def make_styles(runs: pd.DataFrame, agg: pd.DataFrame) -> dict:
    """Colour by norm, line style by placement; a marker tells apart configs sharing both."""
    # norm/placement need not be group keys: a config mixing several gets the "mixed" style.
    names = runs.groupby("config", sort=False)[["norm", "placement"]].agg(
        lambda s: s.iloc[0] if s.nunique(dropna=False) == 1 else "mixed").reindex(agg["config"])
    styles, seen = {}, {}
    shared = names.groupby(["norm", "placement"], dropna=False)["norm"].transform("size")
    for label, norm, placement, n in zip(agg["config"], names["norm"], names["placement"], shared):
        i = seen[(norm, placement)] = seen.get((norm, placement), -1) + 1
        linestyle, hatch = PLACEMENT_STYLES.get(str(placement), ((0, (3, 1, 1, 1)), "oo"))
        styles[label] = dict(color=norm_color(norm), linestyle=linestyle, hatch=hatch,
                             marker=MARKERS[i % len(MARKERS)] if n > 1 else None)
    return styles


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
        ncols = math.ceil(len(handles) / max(4, int(fig.get_figheight() * 72 / 15)))
        fig.legend(handles.values(), handles.keys(), loc="outside right upper", fontsize="small", ncols=ncols)


def _plain(text) -> str:
    """A config value as literal chart text: two '$' in a label would otherwise start TeX math."""
    return str(text).replace("$", r"\$")


def _bands(ax, d: ReportData, frame: pd.DataFrame, x: str, y: str) -> None:
    """Per configuration, best first: the mean over seeds as a line, min–max over seeds as a band."""
    frame = frame.dropna(subset=[x, y])
    frame = frame.assign(config=frame["run"].map(d.runs["config"]))
    stats = frame.groupby(["config", x])[y].agg(["mean", "min", "max"])  # one groupby for all configs
    seeds = frame.groupby("config")["run"].nunique()
    for label in d.agg["config"]:
        if label not in seeds.index:
            continue
        s, style = stats.loc[label], d.styles[label]
        ax.plot(s.index, s["mean"], label=_plain(label), color=style["color"], linestyle=style["linestyle"],
                marker=style["marker"], markevery=max(1, len(s) // 8), markersize=4)
        if seeds[label] > 1:
            ax.fill_between(s.index, s["min"], s["max"], color=style["color"], alpha=0.15, linewidth=0)


def _floor(ax, runs: pd.DataFrame) -> None:
    for i, floor in enumerate(sorted(pd.to_numeric(runs["floor_loss"], errors="coerce").dropna().unique())):
        ax.axhline(floor, color="black", linestyle=(0, (5, 3)), linewidth=1,
                   label="synthetic floor (Bayes-optimal loss)" if i == 0 else None)


def _bars(ax, d: ReportData, values: pd.Series, errs: list | None = None) -> None:
    """One bar per configuration in best-first order; ``errs`` holds one matplotlib yerr per bar."""
    for i, (label, value) in enumerate(zip(d.agg["config"], values)):
        if pd.notna(value):
            style = d.styles[label]
            ax.bar(i, value, yerr=None if errs is None else errs[i], capsize=3, color=style["color"],
                   hatch=style["hatch"], edgecolor="black", linewidth=0.5)
    ax.set_xticks(range(len(d.agg)), d.agg["config"].map(_plain), rotation=35, ha="right", fontsize="small")


def _completed(d: ReportData, frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["run"].isin(d.runs.index[d.runs["status"].eq("completed")])]


def chart_loss_curves(d: ReportData):
    train, evals = _completed(d, d.train), _completed(d, d.evals)
    panels = [(train, "step", "train_loss", "Train loss vs step", "step"),
              (evals, "step", "val_loss", "Validation loss vs step", "step"),
              (train, "tokens", "train_loss", "Train loss vs tokens", "tokens seen")]
    panels = [p for p in panels if p[0][[p[1], p[2]]].notna().all(axis=1).any()]
    if not panels:
        return "no completed run logged train or eval losses in metrics.jsonl"
    fig, axes = _figure(len(panels))
    for ax, (frame, x, y, title, xlabel) in zip(axes, panels):
        _bands(ax, d, frame, x, y)
        _floor(ax, d.runs[d.runs["status"].eq("completed")])
        ax.set(title=title, xlabel=xlabel, ylabel="loss (nats/token)")
        ax.grid(alpha=0.3)
    fig.suptitle("Loss curves: mean over seeds, band = min–max (completed runs only)")
    _legend(fig, axes)
    return fig


def chart_final_loss(d: ReportData):
    agg = d.agg
    mean, std, bad = agg["final_val_loss_mean"], agg["final_val_loss_std"].fillna(0), agg["diverged"] + agg["failed"]
    if mean.isna().all() and bad.sum() == 0:
        return "no run reported final_val_loss"
    fig, (ax,) = _figure(1, width=max(5.0, 0.45 * len(agg) + 2), height=5.0)
    _bars(ax, d, mean, list(std))
    _floor(ax, d.runs)
    # Losses differ in the second decimal: a zero baseline would flatten every bar to the same height.
    lows = pd.concat([mean - std, pd.to_numeric(d.runs["floor_loss"], errors="coerce")]).dropna()
    highs = (mean + std).dropna()
    if len(highs):
        span = max(highs.max() - lows.min(), 0.05 * abs(highs.max()), 1e-3)
        ax.set_ylim(max(0.0, lows.min() - span), highs.max() + 0.6 * span)
    for i, (n_bad, n, value) in enumerate(zip(bad, agg["runs"], mean)):
        if n_bad:
            if pd.isna(value):  # nothing completed: a hatched slot, so it is not read as missing data
                ax.axvspan(i - 0.4, i + 0.4, fill=False, hatch="xx", edgecolor="red", linewidth=0.5)
            ax.plot(i, 0.95, "x", color="red", markersize=9, markeredgewidth=2, transform=ax.get_xaxis_transform(),
                    label="diverged/failed runs (not averaged)")
            ax.annotate(f"{n_bad}/{n}", (i, 0.91), xycoords=ax.get_xaxis_transform(), ha="center", va="top",
                        color="red", fontsize="small", backgroundcolor="white")
    ax.set(title="Final validation loss per configuration\n(mean ± std over completed seeds)",
           ylabel="final val loss (nats/token)")
    ax.grid(axis="y", alpha=0.3)
    _legend(fig, [ax])
    return fig


def chart_grad_by_layer(d: ReportData):
    first = d.layers[d.layers["when"].eq("first")]
    last = _completed(d, d.layers[d.layers["when"].eq("last")])  # the init picture holds for every run
    steps = first["step"].dropna().unique()
    at = f"step {steps[0]:.0f}" if len(steps) == 1 else "first stats record"
    panels = [(first, "grad", f"mlp_out grad norm, {at}", "grad norm of mlp_out weight (L2)", True),
              (last, "grad", "mlp_out grad norm, last stats record", "grad norm of mlp_out weight (L2)", True),
              (last, "resid_rms", "Residual-stream RMS, last stats record", "residual RMS", False)]
    panels = [p for p in panels if p[0][p[1]].notna().any()]
    if not panels:
        return "no per-layer stats records in metrics.jsonl"
    fig, axes = _figure(len(panels))
    for ax, (frame, y, title, ylabel, logy) in zip(axes, panels):
        _bands(ax, d, frame, "layer", y)
        ax.set(title=title, xlabel="layer (block index, input → output)", ylabel=ylabel)
        ax.set_yscale("log" if logy else "linear")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    fig.suptitle("Per-layer gradients (Xiong et al. 2020: Post-LN's grow toward the output) and residual RMS")
    _legend(fig, axes)
    return fig


def chart_grad_norm(d: ReportData):
    grads = _completed(d, d.grads)
    if not grads["grad_norm"].notna().any():
        return "no completed run logged stats records with grad_norm"
    fig, (ax,) = _figure(1, width=8)
    _bands(ax, d, grads, "step", "grad_norm")
    ax.set(title="Global gradient norm over training (completed runs)", xlabel="step",
           ylabel="grad norm (L2)", yscale="log")
    ax.grid(alpha=0.3)
    _legend(fig, [ax])
    return fig


def chart_throughput(d: ReportData):
    agg = d.agg
    panels = [("tokens_per_s_mean", None, "Throughput", "tokens/s"),
              ("step_ms_p50_mean", "step_ms_p90_mean", "Step time (bar p50, whisker p90)", "ms/step"),
              ("peak_mem_mb_mean", None, "Peak memory", "MB")]
    panels = [p for p in panels if agg[p[0]].notna().any()]
    if not panels:
        return "no run reported tokens_per_s, step time or peak memory"
    # Many configurations make wide bar panels: stack them instead of putting them side by side.
    fig, axes = _figure(len(panels), width=max(4.0, 0.4 * len(agg) + 1.5), height=4.5, ncols=1 if len(agg) > 6 else 3)
    for ax, (col, upper, title, unit) in zip(axes, panels):
        errs = None if upper is None else [[[0], [u]] for u in (agg[upper] - agg[col]).clip(lower=0).fillna(0)]
        _bars(ax, d, agg[col], errs)
        ax.set(title=title, ylabel=unit)
        ax.grid(axis="y", alpha=0.3)
    if len(axes) > 1 and len(agg) > 6:
        for ax in axes[:-1]:  # stacked panels share the configuration labels of the bottom one
            ax.tick_params(labelbottom=False)
    fig.suptitle("Speed and memory per configuration (mean over runs)")
    return fig


def chart_stability(d: ReportData):
    runs = d.runs
    if "train.lr" not in runs or runs["train.lr"].nunique() < 2:
        return "train.lr does not vary across runs"
    varying = [k for k in ("train.warmup_steps", "model.n_layer") if k in runs and runs[k].nunique() > 1]
    ykey = varying[0] if varying else None
    panel_keys = ["norm", "placement", *varying[1:]]
    cells = runs.assign(
        lr=pd.to_numeric(runs["train.lr"], errors="coerce"), y=runs[ykey] if ykey else "",
        loss=runs["final_val_loss"].where(runs["status"].eq("completed")),
        bad=runs["status"].isin(["diverged", "failed"]),
    ).groupby([*panel_keys, "y", "lr"], dropna=False).agg(
        loss=("loss", "mean"), bad=("bad", "sum"), n=("bad", "size")).reset_index()
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
        im = ax.imshow(np.ma.masked_invalid(loss.to_numpy(float)), cmap=cmap, vmin=vmin, vmax=vmax,
                       aspect="auto", origin="lower")
        for (i, j), value in np.ndenumerate(loss.to_numpy(float)):
            n_bad, n_all = bad.iat[i, j], n.iat[i, j]
            text = "" if math.isnan(value) else f"{value:.2f}"
            if n_bad > 0:
                text += f"\n× {n_bad:.0f}/{n_all:.0f} div" if text else f"× {n_bad:.0f}/{n_all:.0f}\ndiverged"
            ax.text(j, i, text, ha="center", va="center", fontsize="x-small",
                    color="red" if n_bad > 0 else ("white" if value < (vmin + vmax) / 2 else "black"))
        ax.set_xticks(range(len(lrs)), [f"{v:g}" for v in lrs], rotation=35)
        ax.set_yticks(range(len(ys)), [_fmt_value(v) for v in ys])
        ax.set(title=_plain(" / ".join(map(_fmt_value, pkey))), xlabel="peak learning rate (train.lr)",
               ylabel=ykey or "")
    fig.colorbar(im, ax=list(axes), label="final val loss (nats/token), mean over completed seeds")
    fig.suptitle("Stability map: grey × cells = diverged/failed runs (not averaged)")
    return fig


def chart_bench(d: ReportData):
    if d.bench is None or d.bench.empty:
        return "no bench CSV among the inputs (pass the file from `normbench bench --out X.csv`)"
    # One panel per setting that changes the timings, so each line compares like with like.
    keys = ["device", "dtype", "pass"] + ["tokens"] * ("tokens" in d.bench and d.bench["tokens"].nunique() > 1)
    panels = list(d.bench.groupby(keys, sort=True))
    fig, axes = _figure(len(panels))
    for ax, (panel, part) in zip(axes, panels):
        for (norm, impl), line in part.groupby(["norm", "impl"], sort=True):
            line = line.sort_values("dim")
            ax.plot(line["dim"], line["ms"], color=norm_color(norm), linestyle=IMPL_LINESTYLES.get(str(impl), "-."),
                    marker="o", markersize=3, label=_plain(f"{norm} ({impl})"))
        title = " · ".join(f"{k}={v}" if k == "tokens" else str(v) for k, v in zip(keys, panel))
        ax.set(title=_plain(title), xlabel="hidden size (dim)", ylabel="time per call (ms)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
    fig.suptitle("Norm micro-benchmark (colour = norm, line style = implementation)")
    _legend(fig, axes)
    return fig


CHARTS = (
    ("loss_curves", "Loss curves", chart_loss_curves),
    ("final_loss", "Final validation loss per configuration", chart_final_loss),
    ("grad_by_layer", "Gradient norm and residual RMS by layer", chart_grad_by_layer),
    ("grad_norm", "Global gradient norm over training", chart_grad_norm),
    ("throughput", "Throughput, step time and memory", chart_throughput),
    ("stability", "Stability map (learning rate)", chart_stability),
    ("bench", "Norm micro-benchmark", chart_bench),
)
RUN_CHARTS = {name for name, _, _ in CHARTS} - {"bench"}


# ----------------------------------------------------------------------------- output


def render_html(title: str, inputs: list[Path], warnings: list[str], table: pd.DataFrame | None,
                charts: list[tuple[str, bytes | None, str | None]], runs: pd.DataFrame | None) -> str:
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>"
             "body{font-family:sans-serif;max-width:1400px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}"
             "img{max-width:100%}.note{color:#666}.warn{color:#a60}</style></head><body>",
             f"<h1>{e(title)}</h1>",
             "<p>Inputs: " + ", ".join(f"<code>{e(str(p))}</code>" for p in inputs) + "</p>"]
    if warnings:
        parts.append("<h2>Warnings</h2><ul>" + "".join(f"<li class='warn'>{e(w)}</li>" for w in warnings) + "</ul>")
    if table is not None:
        parts += ["<h2>Aggregate</h2>",
                  "<p>Loss mean ± std (n) over <b>completed</b> runs only; diverged and failed runs are counted "
                  "in their own columns, never averaged in.</p>", table.to_html(index=False, escape=True)]
    parts.append("<h2>Charts</h2>")
    for chart_title, png, note in charts:
        if png is None:
            parts.append(f"<p class='note'><b>{e(chart_title)}</b>: not drawn ({e(note)}).</p>")
        else:
            data = base64.b64encode(png).decode()
            parts.append(f"<figure><img alt='{e(chart_title)}' src='data:image/png;base64,{data}'>"
                         f"<figcaption>{e(chart_title)}</figcaption></figure>")
    if runs is not None:
        parts += [f"<h2>Runs</h2><details><summary>{len(runs)} runs</summary>",
                  runs.to_html(index=False, escape=True, na_rep="–"), "</details>"]
    parts.append("</body></html>")
    return "\n".join(parts)


def run_report(paths: list[Path], out: Path | None = None, group_by: list[str] | None = None,
               metric: str = "final_val_loss", formats: tuple[str, ...] = ("png",),
               console: Console | None = None) -> Path:
    """Read every run below ``paths`` (plus any bench CSV among them), write the report, return its folder."""
    start = time.perf_counter()
    console = console or Console()
    paths = [Path(p) for p in paths]
    if isinstance(formats, str):
        formats = formats.split(",")
    if not paths:
        raise ConfigError("no input paths given", allowed=["a run or sweep directory", "a bench .csv file"])
    if metric not in METRICS:
        raise ConfigError(f"unknown metric {metric!r}", allowed=METRICS)
    for fmt in formats:
        if fmt not in FORMATS:
            raise ConfigError(f"unknown chart format {fmt!r}", allowed=FORMATS)

    run_dirs, bench_csvs = find_inputs(paths)
    where = ", ".join(map(str, paths))
    if not run_dirs and not bench_csvs:
        raise ConfigError(f"no run directories found under {where} (a run directory holds a config.yaml)")
    warnings = []

    def warn(message: str) -> None:
        warnings.append(message)
        console.print(f"[yellow]warning:[/yellow] {escape(message)}")

    d = load_runs(run_dirs, warn)
    d.bench = read_bench(bench_csvs)
    if run_dirs and d.runs.empty:
        raise ConfigError(f"found {len(run_dirs)} run directories under {where} but none could be read "
                          "(see the warnings)")
    out = Path(out) if out is not None else (paths[0] if paths[0].is_dir() else paths[0].parent) / "report"
    out.mkdir(parents=True, exist_ok=True)

    table = None
    if len(d.runs):
        d.keys = resolve_group_keys(group_by, d)
        d.runs.insert(1, "config", [config_label(d.keys, v) for v in d.runs[d.keys].itertuples(index=False)])
        d.agg = aggregate(d.runs, d.keys, metric)
        d.styles = make_styles(d.runs, d.agg)
        table = display_table(d.agg, d.keys, metric)
        write_atomic(out / "summary.csv", d.runs.to_csv(index=False))
        write_atomic(out / "aggregate.csv", d.agg.to_csv(index=False))
        write_atomic(out / "summary.md", f"Sorted by `{metric}`. Loss mean ± std (n) over completed runs only; "
                                         "diverged and failed runs are counted, not averaged.\n\n" + to_markdown(table))

    charts, written = [], set()
    for name, title, draw in CHARTS:
        try:
            result = "no run directories among the inputs" if name in RUN_CHARTS and d.agg is None else draw(d)
        except Exception as err:  # odd data in one chart must not cost the tables and the other charts
            warn(f"chart {name} failed: {err!r}")
            result = f"failed: {err!r}"
        if isinstance(result, str):
            console.print(f"[dim]note: chart {name} not drawn: {escape(result)}[/dim]")
            charts.append((title, None, result))
            continue
        buffer = io.BytesIO()
        result.savefig(buffer, format="png", dpi=DPI)
        charts.append((title, buffer.getvalue(), None))
        write_atomic(out / f"{name}.png", buffer.getvalue())
        written.add(f"{name}.png")
        for fmt in set(formats) - {"png"}:
            buffer = io.BytesIO()
            result.savefig(buffer, format=fmt, dpi=DPI)
            write_atomic(out / f"{name}.{fmt}", buffer.getvalue())
            written.add(f"{name}.{fmt}")
    # A chart left out this time must not survive from an earlier report in the same folder.
    for name, _, _ in CHARTS:
        for fmt in FORMATS:
            if f"{name}.{fmt}" not in written:
                (out / f"{name}.{fmt}").unlink(missing_ok=True)

    write_atomic(out / "report.html", render_html("normbench report", paths, warnings, table, charts,
                                                  None if d.agg is None else d.runs))
    if table is not None:
        order = "descending" if metric in HIGHER_IS_BETTER else "ascending"
        title = f"{len(d.runs)} runs, {len(d.agg)} configurations, by {metric} ({order})"
        print_table(console, table, title, len(d.keys))
    console.print(f"report written to {escape(str(out))} in {time.perf_counter() - start:.1f}s")
    return out

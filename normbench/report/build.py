"""``run_report``: the report from start to end, one stage per module.

    load     read the runs (and bench CSVs) below the inputs        -> ReportData
    metrics  the --metric the verdict is about: its label, unit, direction
    tables   group keys, the aggregate per configuration
    tuning   the tuning axis: best value, LR sensitivity, seed statistics vs the best (stats)
    scale    the scale axis: each comparison across sizes, its trend, the best value's drift
    predict  with --predict: each configuration's law, the prediction at the sizes asked, the backtest
    verdict  the generated sentences
    charts   the registered charts
    render   report.html, summary.md, the terminal

and the files: summary.csv, aggregate.csv, tuned.csv, scale.csv, trend.csv, predict.csv,
backtest.csv, summary.md, report.html, the charts.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape

from normbench.core.errors import ConfigError
from normbench.core.fileio import write_atomic
from normbench.core.runs import PLAN, SUMMARY, RunLock
from normbench.report.charts import FORMATS, draw_charts
from normbench.report.charts.styles import make_styles, size_styles
from normbench.report.load import NUMERICS, find_inputs, in_bits_per_byte, load_runs, read_bench
from normbench.report.metrics import BITS_PER_BYTE, METRICS, loss_unit
from normbench.report.metrics import metric as metric_of
from normbench.report.predict import (
    backtest,
    check_sizes,
    parse_predict,
    predict_sentences,
    prediction,
    withhold,
)
from normbench.report.render import print_table, print_verdict, render_html, summary_markdown
from normbench.report.scale import resolve_baseline, resolve_scale_key, scale_axis
from normbench.report.select import select_runs
from normbench.report.tables import (
    aggregate,
    config_label,
    display_table,
    resolve_group_keys,
    scale_tables,
    tuned_table,
)
from normbench.report.tuning import aggregate_statistics, resolve_tune_key, tune
from normbench.report.verdict import provenance_summary, scale_verdict, verdict


def nothing_finished(paths: list[Path], run_dirs: list[Path]) -> str:
    """One line for a sweep in progress with no result yet: how many run, were cut short or wait."""
    started = {run_dir.resolve() for run_dir in run_dirs}
    running = sum(RunLock(run_dir).holder() is not None for run_dir in run_dirs)
    planned = [
        path / job["run_dir"]
        for path in paths
        if (path / PLAN).is_file()
        for job in json.loads((path / PLAN).read_text(encoding="utf-8")).get("jobs", [])
    ]
    pending = sum((path.resolve() not in started) for path in planned)
    counts = [
        f"{running} running",
        *([f"{len(run_dirs) - running} interrupted"] if len(run_dirs) > running else []),
        f"{pending} pending",
    ]
    return (
        f"nothing finished yet in {', '.join(map(str, paths))}: {', '.join(counts)}; "
        "run normbench report again once a run has finished"
    )


def _check_options(paths, metric, formats) -> None:
    if not paths:
        raise ConfigError("no input paths given", allowed=["a run or sweep directory", "a bench .csv file"])
    if metric not in METRICS:
        raise ConfigError(f"unknown metric {metric!r}", allowed=list(METRICS))
    for fmt in formats:
        if fmt not in FORMATS:
            raise ConfigError(f"unknown chart format {fmt!r}", allowed=FORMATS)


def _check_numerics(d, allow_mixed: bool) -> None:
    """Runs of different numerics versions are different computations: compared only when asked."""
    versions = sorted(d.runs[NUMERICS].unique())
    if len(versions) > 1 and not allow_mixed:
        raise ConfigError(
            f"the runs were computed with different numerics versions ({', '.join(map(str, versions))}), "
            "so they are not the same computation; report each version apart, or pass --allow-mixed to "
            "compare them anyway"
        )


def _check_metric(d, metric: str) -> None:
    """A metric no completed run reports cannot rank anything: refused, naming those that can."""
    done = d.runs[d.runs["status"].eq("completed")]
    if len(done) and done[metric_of(metric).source].isna().all():
        bytes_known = (
            "bytes_per_token" in done
            and pd.to_numeric(done["bytes_per_token"], errors="coerce").notna().all()
        )
        reported = [
            m
            for m, spec in METRICS.items()
            if done[spec.source].notna().any() and (m not in BITS_PER_BYTE or bytes_known)
        ]
        raise ConfigError(f"--metric {metric}: no completed run reports it", allowed=reported)


def _nothing_completed(d) -> str:
    """One line for runs that all ended without completing."""
    counts = d.runs["status"].value_counts()
    return (
        f"no run completed among the {len(d.runs)} runs ("
        + ", ".join(f"{n} {status}" for status, n in counts.items())
        + "): nothing to compare; see the error column of summary.csv"
    )


@dataclass
class Shown:
    """What the report says and shows, built from the runs: its sentences and display tables."""

    sentences: list[str] = field(default_factory=list)
    table: pd.DataFrame | None = None  # the aggregate, as displayed
    tuned: pd.DataFrame | None = None  # tuned.csv, as displayed
    scale: tuple | None = None  # (the size key, its sentences, its tables)
    nothing: bool = False  # runs, none of which completed


@dataclass
class Options:
    """How the runs are grouped, tuned, scaled, filtered and predicted (run_report's arguments)."""

    group_by: list[str] | None
    metric: str
    tune_key: str | None
    scale_key: str | None
    baseline: str | None
    allow_mixed: bool
    where: list[str]
    exclude: list[str]
    targets: list | None


def run_report(
    paths: list[Path],
    out: Path | None = None,
    group_by: list[str] | None = None,
    metric: str = "final_val_loss",
    formats: tuple[str, ...] = ("png",),
    tune_key: str | None = None,
    scale_key: str | None = None,
    baseline: str | None = None,
    predict: str | None = None,
    console: Console | None = None,
    allow_mixed: bool = False,
    where: list[str] | None = None,
    exclude: list[str] | None = None,
) -> Path:
    """Read every run below ``paths`` (plus any bench CSV among them), write the report, return its folder.

    ``tune_key``: the key each configuration is tuned over (None: train.lr when it varies; "none": off).
    ``scale_key``: the size axis (None: the one size key that varies, if one does; "none": off);
    ``baseline``: the configuration compared with across sizes ("norm=ln,placement=pre"; None: the best
    at the largest size); ``predict``: sizes to predict each configuration's loss and gap at
    ("1.2e6,4e6", in parameters, or tokens for a token key; normbench.report.predict).
    ``metric`` (normbench.report.metrics) drives the ranking, the tuning, the intervals and the verdict;
    ``allow_mixed``: compare runs of different numerics versions (refused otherwise).
    ``where``, ``exclude``: ``KEY=VALUE`` filters on the runs' config (normbench.report.select).
    """
    start = time.perf_counter()
    console = console or Console()
    paths = [Path(p) for p in paths]
    formats = formats.split(",") if isinstance(formats, str) else formats
    _check_options(paths, metric, formats)
    options = Options(
        group_by,
        metric,
        tune_key,
        scale_key,
        baseline,
        allow_mixed,
        where or [],
        exclude or [],
        _targets(predict, scale_key),
    )
    run_dirs, bench_csvs = _inputs(paths)
    warnings = []

    def warn(message: str) -> None:
        warnings.append(message)
        console.print(f"[yellow]warning:[/yellow] {escape(message)}")

    d, kept, scale = _read(paths, run_dirs, bench_csvs, options, warn)
    out = Path(out) if out is not None else (paths[0] if paths[0].is_dir() else paths[0].parent) / "report"
    out.mkdir(parents=True, exist_ok=True)
    shown = _write_tables(d, out, options, kept, scale, warn)
    charts, not_drawn = draw_charts(d, out, formats, warn)
    write_atomic(out / "report.html", _html(d, paths, shown, warnings, charts, out, metric))
    _print(console, d, shown, metric, scale)
    if not_drawn and not shown.nothing:  # after the verdict and the tables: one line
        console.print(f"[dim]charts not drawn: {escape('; '.join(not_drawn))}[/dim]", soft_wrap=True)
    console.print(f"report written to {escape(str(out))} in {time.perf_counter() - start:.1f}s")
    return out


def _targets(predict: str | None, scale_key: str | None) -> list | None:
    """The sizes --predict asks for (None without it); refused without a size axis."""
    targets = parse_predict(predict) if predict is not None else None
    if targets and scale_key in (None, "none"):
        raise ConfigError(
            "--predict extrapolates along a size axis: it needs --scale",
            allowed=["--scale KEY --predict VALUE (model.d_model, model.n_layer, train.steps, ...)"],
        )
    return targets


def _inputs(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """(the run directories, the bench CSVs) below ``paths``; one line where there is nothing to read."""
    run_dirs, bench_csvs = find_inputs(paths)
    planned = any((path / PLAN).is_file() for path in paths)
    if (
        not bench_csvs
        and (run_dirs or planned)
        and not any((run_dir / SUMMARY).exists() for run_dir in run_dirs)
    ):
        raise ConfigError(nothing_finished(paths, run_dirs))  # a sweep in progress: one line, no warnings
    if not run_dirs and not bench_csvs:
        inputs = ", ".join(map(str, paths))
        raise ConfigError(f"no run directories found under {inputs} (a run directory holds a config.yaml)")
    return run_dirs, bench_csvs


def _read(paths, run_dirs, bench_csvs, o: Options, warn) -> tuple:
    """(the runs read and checked, the filters' sentence, the scale axis: (key, its other fields,
    baseline)); every input check is made here, before the first file is written."""
    d = load_runs(run_dirs, warn)
    d.bench, d.metric = read_bench(bench_csvs), o.metric
    if run_dirs and d.runs.empty:
        raise ConfigError(
            f"found {len(run_dirs)} run directories under {', '.join(map(str, paths))} but none could be "
            "read (see the warnings)"
        )
    kept = select_runs(d, o.where, o.exclude) if len(d.runs) else None
    scale = None
    if len(d.runs):
        _check_numerics(d, o.allow_mixed)
        if o.metric in BITS_PER_BYTE:
            in_bits_per_byte(d, o.metric)
        _check_metric(d, o.metric)
        d.tune = resolve_tune_key(o.tune_key, d)
        d.keys = resolve_group_keys(o.group_by, d)
        scale = resolve_scale_key(o.scale_key, d)
        d.size_key = scale[0]
        scale = (*scale, resolve_baseline(o.baseline, d, scale[0]))
        if o.targets:
            check_sizes(scale[0], d.runs[scale[0]])
    elif o.baseline is not None or o.scale_key not in (None, "none"):
        raise ConfigError("--scale and --baseline compare run directories, and the inputs hold none")
    return d, kept, scale


STALE = ["aggregate.csv", "tuned.csv", "scale.csv", "trend.csv", "predict.csv", "backtest.csv"]


def _write_tables(d, out: Path, o: Options, kept, scale, warn) -> Shown:
    """The comparison of the runs, written: summary.csv, aggregate.csv, tuned.csv, scale.csv, trend.csv,
    predict.csv, backtest.csv and summary.md (files of an earlier report that this one lacks removed)."""
    if not len(d.runs):
        return Shown()
    if not d.runs["status"].eq("completed").any():
        sentences = [" ".join(filter(None, [kept, _nothing_completed(d)]))]  # nothing to compare
        write_atomic(out / "summary.csv", d.runs.to_csv(index=False))
        write_atomic(out / "summary.md", f"## Verdict\n\n- {sentences[0]}\n")
        for name in STALE:  # from an earlier report in the same folder
            (out / name).unlink(missing_ok=True)
        return Shown(sentences, nothing=True)
    table = _compare(d, o.metric, scale, warn)
    shown = Shown([kept, *verdict(d)] if kept else verdict(d), table)
    write_atomic(out / "summary.csv", d.runs.to_csv(index=False))
    write_atomic(out / "aggregate.csv", d.agg.to_csv(index=False))
    shown.tuned = _write_tuned(d, out, scale[0])
    shown.scale = _write_scale(d, out, scale[0])
    if o.targets:
        _write_predict(d, out, o.targets, shown.scale)
    write_atomic(
        out / "summary.md",
        summary_markdown(
            o.metric, shown.sentences, table, shown.tuned, d.tune, shown.scale, provenance_summary(d.runs)
        ),
    )
    return shown


def _compare(d, metric: str, scale, warn) -> pd.DataFrame:
    """The configurations compared: the aggregate, each at its best tuned value, with their seed
    statistics and styles, and the scale axis; the aggregate's display table."""
    for key in (d.tune, scale[0]):
        if key and key not in d.keys:
            d.keys.append(key)  # the aggregate keeps one row per value of the tuned key and per size
    d.runs.insert(1, "config", [config_label(d.keys, v) for v in d.runs[d.keys].itertuples(index=False)])
    d.agg = aggregate(d.runs, d.keys, metric, scale[0])
    d.tuned = tune(d, d.tune, warn) if d.tune else None
    d.agg = d.agg.join(aggregate_statistics(d))
    d.styles = make_styles(d.runs, d.agg, d.tune)
    if scale[0]:  # before the verdict, which compares the configurations within each size
        d.scale = scale_axis(d, *scale)
        d.styles = size_styles(d)
    return display_table(d.agg, d.keys, metric)


def _write_tuned(d, out: Path, size_key: str | None) -> pd.DataFrame | None:
    """tuned.csv and its display table (by size with a scale axis), or neither without a tuned key."""
    if d.tuned is None:
        (out / "tuned.csv").unlink(missing_ok=True)  # from an earlier, tuned report in the same folder
        return None
    shown = tuned_table(d.tuned)
    if d.scale is not None:  # by size; each size's own comparison is in the verdict and scale.csv
        order = d.tuned[size_key].sort_values(kind="stable").index
        shown = shown.loc[order].drop(columns=["vs best", "p"]).reset_index(drop=True)
    write_atomic(out / "tuned.csv", d.tuned.to_csv(index=False))
    return shown


def _write_scale(d, out: Path, size_key: str | None) -> tuple | None:
    """scale.csv and trend.csv with a scale axis, and what the report shows of it; the files of an
    earlier report this one has no counterpart for removed."""
    for name in STALE[2:]:  # from an earlier report in the same folder
        if not (size_key and name in ("scale.csv", "trend.csv")):
            (out / name).unlink(missing_ok=True)
    if not size_key:
        return None
    write_atomic(out / "scale.csv", d.scale.table.to_csv(index=False))
    write_atomic(out / "trend.csv", d.scale.trend.to_csv(index=False))
    return (d.scale.key, scale_verdict(d.scale), *scale_tables(d.scale))


def _write_predict(d, out: Path, targets: list, scale_shown: tuple) -> None:
    """predict.csv (and backtest.csv), their sentences added to the scale axis's."""
    d.backtest = backtest(d.scale)
    d.predict = withhold(prediction(d.scale, targets), d.backtest)
    scale_shown[1].extend(predict_sentences(d.scale, d.predict, d.backtest))
    write_atomic(out / "predict.csv", d.predict.to_csv(index=False))
    if d.backtest is not None:
        write_atomic(out / "backtest.csv", d.backtest.to_csv(index=False))


def _html(d, paths, shown: Shown, warnings, charts, out: Path, metric: str) -> str:
    return render_html(
        "normbench report",
        paths,
        shown.sentences,
        warnings,
        shown.table,
        shown.tuned,
        d.tune,
        charts,
        None if d.agg is None else d.runs,
        shown.scale,
        provenance_summary(d.runs) if len(d.runs) else None,
        out,
        metric,
    )


def _print(console: Console, d, shown: Shown, metric: str, scale) -> None:
    """The verdict and the tables on the terminal (one line where nothing completed)."""
    if shown.nothing:
        console.print(escape(shown.sentences[0]), highlight=False, soft_wrap=True)
    if shown.table is None:
        return
    print_verdict(console, shown.sentences)
    console.print(f"  {escape(provenance_summary(d.runs))}", highlight=False, style="dim", soft_wrap=True)
    if shown.scale is not None:
        print_verdict(console, shown.scale[1], f"Trend across {shown.scale[0]}")
        print_table(console, shown.scale[3], f"the difference to {d.scale.baseline} against {d.scale.key}", 1)
    m = metric_of(metric)
    order = "descending" if m.higher_is_better else "ascending"
    within = f", within each {scale[0]}" if scale[0] else ""
    title = (
        f"{len(d.runs)} runs, {len(d.agg)} groups, by {m.label} ({m.unit + ', ' if m.unit else ''}{order}"
        f"{within}; losses in {loss_unit(metric)})"
    )
    print_table(console, shown.table, title, len(d.keys))
    if shown.tuned is not None:
        print_table(console, shown.tuned, f"each configuration at its best {d.tune}", 1)

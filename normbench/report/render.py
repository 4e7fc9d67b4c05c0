"""Rendering: the report as one self-contained HTML page, a Markdown summary and terminal output.

Everything here formats what the other stages computed; it computes nothing itself. The
page loads nothing from the network and escapes every string that comes from a config or a path.
"""

from __future__ import annotations

import base64
import html
import os
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from normbench.report.metrics import DEFAULT, metric
from normbench.report.tables import LOGIT_COLUMNS

STYLE = (
    "body{font-family:sans-serif;max-width:1400px;margin:2em auto;padding:0 1em;line-height:1.4}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}"
    "th{background:#f3f3f3}img{max-width:100%}.note{color:#666}.warn{color:#a60}"
    ".verdict{background:#f5f8ff;border-left:4px solid #36c;padding:.5em 1em .5em 2em}"
    ".verdict li{margin:.3em 0}"
)

AGGREGATE_NOTE = (
    "Loss mean ± std (n) over <b>completed</b> runs only; diverged and failed runs are counted in "
    "their own columns, never averaged in. 95% CI: the mean's confidence interval of the report's metric; "
    "vs best: the difference to the best configuration with its 95% CI (see "
    "<a href='{href}'>docs/reports.md</a> for the method)."
)
# The method's page in the source tree: linked relative to the report's folder, so that it resolves
# for a report written inside the repository (results/report/), and absolute otherwise.
METHOD_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reports.md"


def method_link(out: Path) -> str:
    try:
        return Path(os.path.relpath(METHOD_PAGE, Path(out).resolve())).as_posix()
    except ValueError:  # another drive (Windows): no relative path
        return METHOD_PAGE.as_uri()


SCALE_NOTE = (
    "Each configuration at its best value per size, against the baseline at the same size (paired by seed "
    "when both ran the same seeds). Slope: the fitted change of the difference per doubling of the size's "
    "parameters (or tokens), least squares, 95% t interval from the seeds' SEs; grows / shrinks: "
    "|difference| moves away from / toward 0 as the size grows; no trend: the slope's interval includes 0."
)


def render_html(
    title: str,
    inputs: list,
    verdict: list[str],
    warnings: list[str],
    table: pd.DataFrame | None,
    tuned: pd.DataFrame | None,
    tune_key: str | None,
    charts: list[tuple[str, bytes | None, str | None]],
    runs: pd.DataFrame | None,
    scale: tuple | None = None,
    provenance: str | None = None,
    out: Path = Path("."),
    metric_name: str = DEFAULT,
) -> str:
    """``scale``: (key, sentences, per-size table, trend table) of the scale axis, or None;
    ``provenance``: the runs' provenance line; ``out``: the page's folder (for its link to the method);
    ``metric_name``: the report's --metric."""
    e, m = html.escape, metric(metric_name)
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        "<p>Inputs: " + ", ".join(f"<code>{e(str(p))}</code>" for p in inputs) + "</p>",
    ]
    if verdict:
        parts.append(
            "<h2>Verdict</h2><ul class='verdict'>" + "".join(f"<li>{e(s)}</li>" for s in verdict) + "</ul>"
        )
    if provenance:
        parts.append(f"<p class='note'>{e(provenance)}</p>")
    if scale is not None:
        key, sentences, per_size, trend = scale
        parts += [
            f"<h2>Trend across {e(key)}</h2><ul class='verdict'>"
            + "".join(f"<li>{e(s)}</li>" for s in sentences)
            + "</ul>",
            f"<p>{SCALE_NOTE} Written to <code>scale.csv</code> and <code>trend.csv</code>.</p>",
            trend.to_html(index=False, escape=True),
            "<p></p>",
            per_size.to_html(index=False, escape=True),
        ]
    if warnings:
        parts.append(
            "<h2>Warnings</h2><ul>" + "".join(f"<li class='warn'>{e(w)}</li>" for w in warnings) + "</ul>"
        )
    if tuned is not None:
        parts += [
            f"<h2>Each configuration at its best {e(tune_key)}</h2>",
            f"<p>Best value: {m.best_word} mean {e(m.label)} over every seed, a diverged one ranked "
            "with its configuration's worst completed run (choosing on the survivors of a mostly "
            "diverged value would choose on a censored sample); a failed run is not counted. LR "
            "sensitivity: Wortsman et al. (2023), the mean over the grid of min(loss, loss at init) "
            "minus the best loss (diverged = loss at init), for a loss only. Written to "
            "<code>tuned.csv</code>.</p>",
            tuned.to_html(index=False, escape=True),
        ]
    if table is not None:
        note = AGGREGATE_NOTE.format(href=e(method_link(out)))
        parts += ["<h2>Aggregate</h2>", f"<p>{note}</p>", table.to_html(index=False, escape=True)]
    parts.append("<h2>Charts</h2>")
    for chart_title, png, note in charts:
        if png is None:
            parts.append(f"<p class='note'><b>{e(chart_title)}</b>: not drawn ({e(note)}).</p>")
        else:
            data = base64.b64encode(png).decode()
            parts.append(
                f"<figure><img alt='{e(chart_title)}' src='data:image/png;base64,{data}'>"
                f"<figcaption>{e(chart_title)}</figcaption></figure>"
            )
    if runs is not None:
        parts += [
            f"<h2>Runs</h2><details><summary>{len(runs)} runs</summary>",
            runs.to_html(index=False, escape=True, na_rep="–"),
            "</details>",
        ]
    parts.append("</body></html>")
    return "\n".join(parts)


def to_markdown(table: pd.DataFrame) -> str:
    cell = lambda s: str(s).replace("|", "\\|")
    lines = ["| " + " | ".join(map(cell, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def summary_markdown(
    metric: str,
    verdict: list[str],
    table: pd.DataFrame,
    tuned: pd.DataFrame | None,
    tune_key: str | None,
    scale: tuple | None = None,
    provenance: str | None = None,
) -> str:
    parts = ["## Verdict\n", *[f"- {s}" for s in verdict], "", *([provenance, ""] if provenance else [])]
    if scale is not None:
        key, sentences, per_size, trend = scale
        parts += [
            f"## Trend across `{key}`\n",
            *[f"- {s}" for s in sentences],
            "",
            SCALE_NOTE + "\n",
            to_markdown(trend),
            to_markdown(per_size),
        ]
    if tuned is not None:
        parts += [f"## Each configuration at its best `{tune_key}`\n", to_markdown(tuned)]
    parts += [
        f"## Aggregate\n\nSorted by `{metric}`. Loss mean ± std (n) over completed runs only; diverged and "
        "failed runs are counted, not averaged.\n",
        to_markdown(table),
    ]
    return "\n".join(parts)


def print_verdict(console: Console, verdict: list[str], title: str = "Verdict") -> None:
    console.print(f"[bold]{escape(title)}[/bold]")
    for sentence in verdict:
        console.print(f"  • {escape(sentence)}", highlight=False)


# Left out of the terminal table when it would not fit; the CSV, Markdown and HTML keep them.
SECONDARY_COLUMNS = (
    "best val loss",
    "gap to floor",
    "step ms (p50)",
    "peak MB",
    "95% CI",
    "p",
    "values ok/diverged/failed",
    *LOGIT_COLUMNS,
)


def print_table(console: Console, table: pd.DataFrame, title: str, n_keys: int) -> None:
    flagged = ("diverged", "failed", "did not learn")
    quiet = [c for c in (*flagged, "leaks future") if c in table and set(table[c]) <= {"0", "no"}]
    table = table.drop(columns=quiet)  # all-zero columns say nothing a person needs to read
    if console.width < 40 + 14 * len(table.columns):
        # a loss column's header carries its unit: "best val loss (nats/token)"
        table = table.drop(
            columns=[c for c in table if c.split(" (")[0] in SECONDARY_COLUMNS or c in SECONDARY_COLUMNS]
        )
    rich_table = Table(title=title)
    for i, col in enumerate(table.columns):
        rich_table.add_column(col, justify="left" if i < n_keys else "right")
    for row in table.itertuples(index=False):
        # Text(), not str: a config value like "[bold]" must not be read as rich markup.
        rich_table.add_row(
            *(
                Text(v, style="red" if col in flagged and v != "0" else "")
                for col, v in zip(table.columns, row)
            )
        )
    console.print(rich_table)

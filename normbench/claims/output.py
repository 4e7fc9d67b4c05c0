"""The registry's outputs: claims.csv (the data), claims.md and claims.html, and the terminal table.

claims.md is made from the CSV's rows alone (``markdown``), so ``normbench claims report --markdown
claims.csv`` gives the same page from a stored CSV (docs/claims.md is that command's output). The
headline is the count of claims reproduced at this scale; the page says whether the intervals
are corrected for multiplicity.
"""

from __future__ import annotations

import html
import math
import os
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from normbench.claims.verdicts import COLOURS, WORDS, Verdict
from normbench.core.errors import ConfigError
from normbench.core.fileio import write_atomic
from normbench.report.render import to_markdown

COLUMNS = (
    "id",
    "verdict",
    "scale",
    "scale_note",
    "estimate",
    "ci_low",
    "ci_high",
    "level",
    "measure",
    "n_a",
    "n_b",
    "test",
    "p",
    "reason",
    "delta",
    "spread",
    "corrected",
    "predicate",
    "source",
    "claim",
    "provenance",
    "runs",
    "report",
    "changed",
    "planned_n",
    "pilot",
)
MARGINS = ("equivalent", "not_worse")  # the predicates whose verdict is a margin δ
LATER = (
    "delta",
    "spread",
    "note",
    "planned_n",
    "pilot",
)  # columns a claims.csv written by an earlier normbench lacks: read as empty
# Columns an earlier claims.csv lacks, left out of its pages (which stay as that normbench wrote them).
SHOWN_IF_WRITTEN = ("scale",)
HTML_COLOURS = {
    "reproduced": "#1a7f37",
    "not reproduced": "#c62828",
    "inconclusive": "#b26a00",
    "not testable at this scale": "#1f5fa8",
    "not run": "#777",
}


def _report_link(v: Verdict, out: Path) -> str:
    """The claim's own report (normbench report DIR/<id>) relative to ``out``, or the command making it."""
    if v.folder is None:
        return ""
    page = v.folder / "report" / "report.html"
    if page.is_file():
        return os.path.relpath(page, out)
    return f"normbench report {v.folder}"


def scale(v: Verdict) -> str:
    """'mini, 0.81M parameters': the claim's model size, with the mean parameter count of its runs."""
    size = v.claim.scale["model"]
    return f"{size}, {v.params / 1e6:.2g}M parameters" if math.isfinite(v.params) else size


def rows(verdicts: list[Verdict], out: Path) -> pd.DataFrame:
    """claims.csv: one row per claim."""
    records = []
    for v in verdicts:
        o, c = v.outcome, v.claim
        records.append(
            {
                "id": c.id,
                "verdict": v.word,
                "scale": scale(v),
                "scale_note": v.scale_note,
                "estimate": o.estimate,
                "ci_low": o.low,
                "ci_high": o.high,
                "level": o.level,
                "measure": o.unit,
                "n_a": o.n_a,
                "n_b": o.n_b,
                "test": o.test,
                "p": o.p,
                "reason": o.reason,
                "delta": c.predicate.get("delta", math.nan),
                "spread": o.spread,
                "corrected": f"Holm, alpha {v.alpha:.3g}" if v.corrected else "no",
                "predicate": c.kind,
                "source": c.cites,
                "claim": c.claim,
                "provenance": v.provenance,
                "runs": "" if v.folder is None else os.path.relpath(v.folder, out),
                "report": _report_link(v, out),
                "changed": c.note or "",
                "planned_n": v.design.planned_n if v.design else math.nan,
                "pilot": v.design.pilot_text() if v.design else "",
            }
        )
    return pd.DataFrame(records, columns=list(COLUMNS))


def _num(value) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "–"
    return "–" if not math.isfinite(value) else f"{value:.4g}"


def _interval(row, level: bool = True) -> str:
    low, high = _num(row["ci_low"]), _num(row["ci_high"])
    return (
        "–"
        if "–" in (low, high)
        else f"[{low}, {high}]" + (f" {row['level']}" if level and _text(row["level"]) else "")
    )


def _text(value) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _n(row) -> str:
    n_a, n_b = _num(row["n_a"]), _num(row["n_b"])
    return "–" if n_a in ("–", "0") and n_b in ("–", "0") else f"{n_a} / {n_b}"


def _note(row) -> str:
    """The scale note or the reason, and the claim's margin δ in standard deviations of a seed's a - b
    measured in its runs: a margin the seeds' own noise would cross is no test of the claim."""
    note = _text(row["scale_note"]) or _text(row["reason"])
    delta, spread = _num(row["delta"]), _num(row["spread"])
    if row["predicate"] in MARGINS and delta != "–" and spread not in ("–", "0"):
        margin = f"δ {delta} = {float(row['delta']) / float(row['spread']):.1f} seed SDs"
        note = f"{note}; {margin}" if note else margin
    return note


def display(frame: pd.DataFrame) -> pd.DataFrame:
    """The table a person reads: verdict, scale, estimate, interval, n, source, the claim and the note."""
    return pd.DataFrame(
        {
            "claim": frame["id"],
            "verdict": frame["verdict"],
            **({"scale": frame["scale"].map(_text)} if "scale" in frame else {}),
            "estimate": frame["estimate"].map(_num),
            "interval": [_interval(r) for _, r in frame.iterrows()],
            "n (a / b)": [_n(r) for _, r in frame.iterrows()],
            "source": frame["source"],
            "note": [_note(r) for _, r in frame.iterrows()],
        }
    )


def headline(frame: pd.DataFrame) -> str:
    """'7 of 27 claims reproduced at this scale (...), Holm-corrected across the 16 run': the counts with
    the multiplicity correction they were read under. Claims read from the published registry (see
    with_published) were corrected with its family, not with the claims run here: counted apart."""
    published = frame["provenance"].astype(str).str.startswith("published (")
    said = _counts(frame[~published])
    if published.any():
        theirs = frame[published]
        said += f"; {len(theirs)} more as published ({_words(theirs)}, corrected with the published registry)"
    return said


def _words(frame: pd.DataFrame, words=WORDS) -> str:
    """'2 reproduced, 24 inconclusive': how many rows read each of ``words``, those that any do."""
    return ", ".join(f"{n} {w}" for w in words if (n := int(frame["verdict"].eq(w).sum())))


def _counts(frame: pd.DataFrame) -> str:
    rest = _words(frame, WORDS[1:])
    run = int(frame["verdict"].ne("not run").sum())
    corrected = frame["corrected"].astype(str).ne("no").any() if "corrected" in frame else False
    multiplicity = f"Holm-corrected across the {run} run" if corrected else "not corrected for multiplicity"
    planned = pd.to_numeric(frame.get("planned_n", pd.Series(dtype=float)), errors="coerce").notna()
    if planned.any():  # the family is the claims a test decided (a p); seed counts were fixed before they ran
        has_p = pd.to_numeric(frame["p"], errors="coerce").notna()
        waiting = int((planned & ~has_p).sum())  # pre-registered, their confirmations not yet run
        multiplicity = (
            f"one family, Holm-corrected across the {int(has_p.sum())} claims tested; the seed counts of "
            f"{int((planned & has_p).sum())} confirmations fixed by pre-registration before they ran"
            + (f", {waiting} more pre-registered" if waiting else "")
        )
    return (
        f"{int(frame['verdict'].eq('reproduced').sum())} of {len(frame)} claims reproduced at this scale"
        + (f" ({rest})" if rest else "")
        + f", {multiplicity}"
    )


def _g(value) -> str:
    return f"{float(value):.3g}".replace("-", "−")


def headline_table(frame: pd.DataFrame) -> str:
    """The headline and the claims that reproduced or not, with estimate and interval (the README's)."""
    settled = frame[frame["verdict"].isin(WORDS[:2])].sort_values(
        "verdict", key=lambda v: v.map(WORDS.index), kind="stable"
    )
    rows = [
        f"| `{r['id']}` | {r['verdict']} | {_g(r['estimate'])} [{_g(r['ci_low'])}, {_g(r['ci_high'])}] |"
        for _, r in settled.iterrows()
    ]
    return "\n".join(
        [
            f"**{headline(frame)}**; 95% intervals (90%: one-sided), measures in docs/claims.md.",
            "",
            "| claim | verdict | estimate [interval] |",
            "|---|---|---|",
            *rows,
            "",
        ]
    )


def _correction(frame: pd.DataFrame) -> str:
    corrected = frame["corrected"].astype(str).ne("no").any()
    return (
        "Intervals and verdicts are Holm-corrected across the claims tested; 'not reproduced' means "
        "refuted at this scale (significant the other way, or equivalent within a margin smaller than the "
        "source's effect). A pre-registered claim (planned_n, pilot in claims.csv) is decided by its "
        "confirmation alone. Not testable at this scale: its treatment never engages in its runs."
        if corrected
        else "Intervals are 95% (90% for equivalence and non-inferiority, one-sided tests) and not corrected "
        "for multiplicity (normbench claims report corrects them by default; --no-holm leaves them)."
    )


def markdown(frame: pd.DataFrame) -> str:
    """claims.md (and docs/claims.md) from claims.csv's rows: a table of the claims run, then every claim
    with its source."""
    ran = frame[frame["verdict"].ne("not run")]
    table = display(ran).drop(columns="source")  # the list of claims below names each source once
    # a claim's own report: its page linked from the id where written, else the command in the headline
    links = [_text(r) if _text(r).endswith(".html") else "" for r in ran["report"]]
    table["claim"] = [f"[`{i}`]({link})" if link else f"`{i}`" for i, link in zip(ran["id"], links)]
    table.insert(table.columns.get_loc("estimate"), "measure", ran["measure"].map(_text))
    # the level is the headline's (95%, 90% for equivalence); claims.csv keeps it per claim
    intervals = [_interval(r, level=False) for _, r in ran.iterrows()]
    table["estimate"] = [f"{e} {i}" for e, i in zip(table["estimate"], intervals)]
    table.pop("interval")
    sentences = "\n".join(f"- `{r['id']}` ({r['source']}): {r['claim']}" for _, r in frame.iterrows())
    parts = [
        "# Claims\n",
        f"**{headline(frame)}.** {_correction(frame)} δ: a margin in standard deviations of a seed's"
        " a - b here. Not run: not in the table. A claim's runs: normbench report DIR/ID."
        + (
            " What changed in a verdict since an earlier publication, and why: claims.csv's changed column."
            if any(_text(c) for c in frame["changed"])
            else ""
        )
        + "\n",
    ]
    if len(ran):
        parts.append(to_markdown(table))
    return "\n".join([*parts, "## The claims\n", sentences, ""])


def read_csv(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path, dtype={"id": str}, keep_default_na=False, na_values=[""])
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read claims CSV {path}: {err}") from None
    missing = [c for c in COLUMNS if c not in frame and c not in LATER and c not in SHOWN_IF_WRITTEN]
    if missing:
        raise ConfigError(f"{path} is not a claims.csv (missing columns {', '.join(missing)})")
    return frame.reindex(columns=[*frame.columns, *(c for c in LATER if c not in frame)])


def page(frame: pd.DataFrame) -> str:
    """claims.html: the table with each verdict coloured and a link to each claim's report."""
    shown = display(frame)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in shown.columns)
    body = []
    for (_, row), (_, full) in zip(shown.iterrows(), frame.iterrows()):
        cells = []
        for col, value in row.items():
            text = html.escape(_text(value))
            if col == "verdict":
                text = f'<b style="color:{HTML_COLOURS.get(value, "#000")}">{text}</b>'
            if col == "claim":
                link = _text(full["report"])
                text = f'<a href="{html.escape(link)}">{text}</a>' if link.endswith(".html") else text
                text += f'<br><span class="note">{html.escape(full["claim"])}</span>'
            cells.append(f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    style = (
        "body{font-family:sans-serif;max-width:1400px;margin:2em auto}"
        "table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}.note{color:#666}"
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Claims</title>"
        f"<style>{style}</style></head><body>"
        f"<h1>Claims</h1><p><b>{html.escape(headline(frame))}.</b> {html.escape(_correction(frame))}</p>"
        f"<table><tr>{head}</tr>{''.join(body)}</table></body></html>\n"
    )


def with_published(frame: pd.DataFrame, published: Path | None, out: Path) -> pd.DataFrame:
    """The claims not run here read from the published claims.csv (``published``), their provenance
    marked 'published' (it names the commit that computed them): a user's own report never replaces
    the published verdict of a claim they did not run. Nothing to fill when ``out`` is the published
    folder itself, or without one."""
    if published is None or not published.is_file() or out.resolve() == published.parent.resolve():
        return frame
    stored = read_csv(published).set_index("id")
    frame = frame.copy()
    for i, row in frame.iterrows():
        if row["verdict"] == "not run" and row["id"] in stored.index:
            old = stored.loc[row["id"]]
            if old["verdict"] == "not run":
                continue
            frame.loc[i, list(COLUMNS[1:])] = [old.get(c, math.nan) for c in COLUMNS[1:]]
            frame.loc[i, "provenance"] = f"published ({published}): {_text(old['provenance'])}"
            folder = published.parent / _text(old["runs"])
            frame.loc[i, "runs"] = os.path.relpath(folder, out) if _text(old["runs"]) else ""
    return frame


def write(verdicts: list[Verdict], out: Path, published: Path | None = None) -> pd.DataFrame:
    """claims.csv, claims.md and claims.html in ``out`` (claims not run: from ``published``, see
    with_published); returns the CSV's frame."""
    out.mkdir(parents=True, exist_ok=True)
    frame = with_published(rows(verdicts, out), published, out)
    write_atomic(out / "claims.csv", frame.to_csv(index=False))
    frame = read_csv(out / "claims.csv")  # the pages from the CSV as stored, as `claims markdown` reads it
    write_atomic(out / "claims.md", markdown(frame))
    write_atomic(out / "claims.html", page(frame))
    return frame


def show(frame: pd.DataFrame, console: Console) -> None:
    """The terminal's table: the same rows, the verdict word coloured."""
    shown = display(frame)
    table = Table(title=headline(frame), title_justify="left")
    for col in shown.columns:  # the words and numbers whole; the source and the note wrap
        table.add_column(col, no_wrap=col in ("claim", "verdict", "estimate", "n (a / b)"), overflow="fold")
    for _, row in shown.iterrows():
        table.add_row(
            *(Text(_text(v), style=COLOURS.get(v, "") if c == "verdict" else "") for c, v in row.items())
        )
    console.print(table)
    console.print(_correction(frame), soft_wrap=True)

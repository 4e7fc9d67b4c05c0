"""The registry's outputs: claims.csv (the data), claims.md and claims.html, and the terminal table.

claims.md is made from the CSV's rows alone (``markdown``), so ``normbench claims report --markdown
claims.csv`` gives the same page from a stored CSV (the registry's results/claims/claims.md is that
command's output). The
headline is the count of claims reproduced at this scale; the page says whether the intervals
are corrected for multiplicity.
"""

from __future__ import annotations

import html
import math
import os
from pathlib import Path
from statistics import NormalDist

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
    "size",
    "params",
    "data",
    "trend",
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
    "rule_commit",
    "pilot_commit",
    "confirm_commit",
)
MARGINS = ("equivalent", "not_worse")  # the predicates whose verdict is a margin δ
LATER = (
    "delta",
    "spread",
    "note",
    "planned_n",
    "pilot",
    "size",
    "params",
    "data",
    "trend",
    "rule_commit",
    "pilot_commit",
    "confirm_commit",
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
    """claims.csv: one row per claim and size."""
    records = []
    by_id = {v.claim.id: v for v in verdicts}
    for v in verdicts:
        o, c = v.outcome, v.claim
        rule = v.rule or {}
        pair = [by_id.get(c.size_of), v] if c.size_of else [v, by_id.get(f"{c.id}@{c.scale.get('larger')}")]
        records.append(
            {
                "id": c.id,
                "verdict": v.word,
                "size": c.scale["model"],
                "params": round(v.params) if math.isfinite(v.params) else math.nan,
                "data": v.data or _data(c),
                "trend": trend(*pair) if None not in pair else "",
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
                "corrected": _corrected(v),
                "predicate": c.kind,
                "source": c.cites,
                "claim": c.claim,
                "provenance": v.provenance,
                "runs": "" if v.folder is None else os.path.relpath(v.folder, out),
                "report": _report_link(v, out),
                "changed": c.note or "",
                "planned_n": v.design.planned_n if v.design else math.nan,
                "pilot": v.design.pilot_text() if v.design else "",
                "rule_commit": rule.get("rule_commit") or "",
                "pilot_commit": rule.get("pilot_commit") or "",
                "confirm_commit": v.confirm_commit,
            }
        )
    frame = pd.DataFrame(records, columns=list(COLUMNS))
    frame["params"] = frame["params"].astype("Int64")  # a count: written without a decimal point
    return frame


def _corrected(v: Verdict) -> str:
    """'Holm across 38, alpha 0.00132': the family and the level the row was judged at (none without a p)."""
    if not v.corrected:
        return "no"
    tested = math.isfinite(v.outcome.p) and v.word != "not run"
    return f"Holm across {v.family}" + (f", alpha {v.alpha:.3g}" if tested else "")


def _data(claim) -> str:
    """The corpus a claim's sweep names (data=NAME), for a claim not run."""
    return next((o.partition("=")[2] for o in claim.overrides if o.startswith("data=")), "")


def _log_scale(v: Verdict) -> bool:
    """Whether the estimate is a ratio (compared in logs, 1 the null) rather than a difference or slope."""
    return "ratio" in v.outcome.unit


def _standard_error(v: Verdict) -> float:
    """The estimate's standard error read back from its interval and level ('97.5%', '99.8% one-sided'):
    the half-width over the normal quantile of that level (a one-sided level's interval is two-sided at
    twice its tail)."""
    o = v.outcome
    try:
        level = float(o.level.split("%")[0]) / 100
    except ValueError:
        return math.nan
    tail = (1 - level) if "one-sided" in o.level else (1 - level) / 2
    low, high = (math.log(o.low), math.log(o.high)) if _log_scale(v) else (o.low, o.high)
    return (high - low) / 2 / NormalDist().inv_cdf(1 - tail)


def trend(small: Verdict, large: Verdict) -> str:
    """What a claim's two sizes show together: the larger size's estimate minus the smaller's (in logs for a
    ratio), with its 95% interval from the two estimates' standard errors, read as one of: the effect flips
    (each size's interval excludes the null, on opposite sides), grows or shrinks (the difference's interval
    excludes zero; in size, away from the null), or holds within its interval."""
    if not all(
        math.isfinite(x) for v in (small, large) for x in (v.outcome.estimate, v.outcome.low, v.outcome.high)
    ):
        return ""
    log = _log_scale(small)
    at = [math.log(v.outcome.estimate) if log else v.outcome.estimate for v in (small, large)]
    se = math.hypot(_standard_error(small), _standard_error(large))
    if not math.isfinite(se):
        return ""
    diff, half = at[1] - at[0], 1.96 * se
    sides = [
        (v.outcome.low > (1 if log else 0)) - (v.outcome.high < (1 if log else 0)) for v in (small, large)
    ]
    if sides[0] * sides[1] < 0:
        word = "flips"
    elif abs(diff) > half:
        word = "grows" if abs(at[1]) > abs(at[0]) else "shrinks"
    else:
        word = "holds within its interval"
    unit = "log ratio" if log else "difference"
    sizes = f"{large.claim.scale['model']} - {small.claim.scale['model']}"
    return f"{word}: {sizes} {unit} {diff:+.3g} [{diff - half:+.3g}, {diff + half:+.3g}]"


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
            **(
                {"data": frame["data"].map(_text)}
                if frame.get("data", pd.Series(dtype=str)).map(_text).ne("").any()
                else {}
            ),
            **({"scale": frame["scale"].map(_text)} if "scale" in frame else {}),
            "estimate": frame["estimate"].map(_num),
            "interval": [_interval(r) for _, r in frame.iterrows()],
            "n (a / b)": [_n(r) for _, r in frame.iterrows()],
            "source": frame["source"],
            "note": [_note(r) for _, r in frame.iterrows()],
            **(
                {"trend": frame["trend"].map(_text)}
                if frame.get("trend", pd.Series(dtype=str)).map(_text).ne("").any()
                else {}
            ),
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
    sizes = frame["size"].map(_text) if "size" in frame else pd.Series("", index=frame.index)
    unit = "rows (claims x sizes)" if sizes.ne("").any() else "claims"
    run = int(frame["verdict"].ne("not run").sum())
    corrected = frame["corrected"].astype(str) if "corrected" in frame else pd.Series(dtype=str)
    across = corrected.str.extract(r"across (\d+)")[0].dropna()
    if len(across):  # one fixed family: every row of the registry
        multiplicity = f"one family, Holm-corrected across all {across.iloc[0]} rows"
    elif corrected.ne("no").any():
        multiplicity = f"Holm-corrected across the {run} run"
    else:
        multiplicity = "not corrected for multiplicity"
    planned = pd.to_numeric(frame.get("planned_n", pd.Series(dtype=float)), errors="coerce").notna()
    if planned.any():  # seed counts fixed by pre-registration before their confirmations ran
        has_p = pd.to_numeric(frame["p"], errors="coerce").notna()
        waiting = int((planned & ~has_p).sum())  # pre-registered, their confirmations not yet run
        tested = "" if len(across) else f" across the {int(has_p.sum())} claims tested"
        multiplicity = (
            (f"{multiplicity}; " if len(across) else "one family, Holm-corrected" + tested + "; ")
            + (
                "the seed count of 1 confirmation fixed by pre-registration before it ran"
                if (confirmed := int((planned & has_p).sum())) == 1
                else f"the seed counts of {confirmed} confirmations fixed by pre-registration before they ran"
            )
            + (f", {waiting} more pre-registered" if waiting else "")
        )
    by_size = ""
    if sizes.ne("").any() and sizes.nunique() > 1:
        by_size = "; " + "; ".join(
            f"{size}: {int(part['verdict'].eq('reproduced').sum())} reproduced, "
            f"{int(part['verdict'].eq('not reproduced').sum())} not reproduced of {len(part)}"
            for size, part in frame.groupby(sizes, sort=False)
        )
    return (
        f"{int(frame['verdict'].eq('reproduced').sum())} of {len(frame)} {unit} reproduced at this scale"
        + (f" ({rest})" if rest else "")
        + by_size
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
            f"**{headline(frame)}**; 95% intervals (90%: one-sided), measures in results/claims/claims.md.",
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
        "Intervals and verdicts are Holm-corrected across every row of the registry (each claim at each "
        "size, run or not); 'not reproduced' means "
        "refuted at this scale (significant the other way, or equivalent within a margin smaller than the "
        "source's effect). A pre-registered claim (planned_n, pilot in claims.csv) is decided by its "
        "confirmation alone. Not testable at this scale: its treatment never engages in its runs."
        if corrected
        else "Intervals are 95% (90% for equivalence and non-inferiority, one-sided tests) and not corrected "
        "for multiplicity (normbench claims report corrects them by default; --no-holm leaves them)."
    )


def markdown(frame: pd.DataFrame) -> str:
    """claims.md from claims.csv's rows: a table of the claims run, then every claim
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
    # each claim once: its row at a larger size (ID@SIZE) says the same sentence
    claims = frame[~frame["id"].astype(str).str.contains("@")]
    sentences = "\n".join(f"- `{r['id']}` ({r['source']}): {r['claim']}" for _, r in claims.iterrows())
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


def _sizes(frame: pd.DataFrame) -> str:
    """'mini (0.81M parameters), midi (3.2M parameters)': each size the rows ran at, by its runs' mean."""
    params = pd.to_numeric(frame["params"], errors="coerce")
    said = []
    for size in dict.fromkeys(frame["size"].map(_text)):
        mean = params[frame["size"].map(_text).eq(size)].mean()
        said.append(f"{size} ({mean / 1e6:.2g}M parameters)" if math.isfinite(mean) else size)
    return ", ".join(said)


def readme(frame: pd.DataFrame) -> str:
    """The published registry's README.md, from its claims.csv alone: what the rows are, how each was
    decided, and how to recompute them."""
    commits = frame[["rule_commit", "pilot_commit", "confirm_commit"]].map(_text)
    trends = frame[frame["trend"].map(_text).ne("") & frame["id"].str.contains("@")]
    corpora = ", ".join(sorted({_text(d) for d in frame["data"] if _text(d)})) or "none"
    lines = [
        "# The claims registry, published",
        "",
        f"`claims.csv` holds one row per claim and size: {len(frame)} rows, on {corpora} (character-level "
        "tiny-shakespeare, shipped with normbench and checked by its SHA-256), at "
        f"{_sizes(frame)}. A claim's second size doubles the width at the claim's own depth and keeps its "
        "steps, batch and context: the two rows of a claim differ in parameters alone, at equal tokens. "
        "This file, `claims.md` and `claims.html` are written by `normbench claims report` from the records "
        "beside them.",
        "",
        f"**{headline(frame)}.**",
        "",
        "How a row is decided: its rule (sweep, arms, metric, predicate, margin, engagement rule, fewest "
        "seeds) is committed first (`rule_commit`); its pilot runs at a later clean commit (`pilot_commit`, "
        "recorded in `ID/rule.yaml` when it starts) and fixes only each arm's tuned value and the "
        "confirmation's seed count (`confirmations/ID/prereg.yaml`, committed before the confirmation); the "
        "confirmation runs fresh seeds at a later clean commit that holds it (`confirm_commit`) and alone "
        "decides. A row whose rule changed after its pilot began decides nothing. Holm corrects across every "
        f"row, run or not (`corrected`). Rows with a pilot: {int(commits['pilot_commit'].ne('').sum())}; "
        f"with a confirmation: {int(commits['confirm_commit'].ne('').sum())}.",
        "",
    ]
    if len(trends):
        lines += ["What the two sizes show together (`trend`):", ""]
        lines += [f"- `{r['id'].split('@')[0]}`: {r['trend']}" for _, r in trends.iterrows()]
        lines.append("")
    lines += [
        "Each row's records: `ID/` (every run's `config.yaml`, `summary.json` and `metrics.jsonl`, the "
        "claim's YAML as run, `rule.yaml`) and `confirmations/ID/`. Anyone can recompute every verdict from "
        "them, offline, and nothing changes:",
        "",
        "    normbench claims report results/claims   # rewrites claims.csv, .md, .html and README.md",
        "    git status --short results/claims        # nothing",
        "",
        "To run the registry again: `./scripts/publish_claims.sh` (each claim in a clean worktree of HEAD, "
        "resumable). The earlier registry, on a 64-symbol synthetic Markov chain, is kept apart in "
        "`results/claims-synthetic/`, retired.",
        "",
    ]
    return "\n".join(lines)


def write(
    verdicts: list[Verdict], out: Path, published: Path | None = None, with_readme: bool = False
) -> pd.DataFrame:
    """claims.csv, claims.md and claims.html in ``out`` (claims not run: from ``published``, see
    with_published), and the registry's README.md ``with_readme``; returns the CSV's frame."""
    out.mkdir(parents=True, exist_ok=True)
    frame = with_published(rows(verdicts, out), published, out)
    write_atomic(out / "claims.csv", frame.to_csv(index=False))
    frame = read_csv(out / "claims.csv")  # the pages from the CSV as stored, as `claims markdown` reads it
    write_atomic(out / "claims.md", markdown(frame))
    write_atomic(out / "claims.html", page(frame))
    if with_readme:
        write_atomic(out / "README.md", readme(frame))
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

"""The documentation holds together: README.md stays a short front door, and every relative link in
README.md and docs/ points at a file that exists and, with a #anchor into a markdown file, at one of
its headings (GitHub's slugs). Standard library and pytest only."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_LIMIT = 15_000
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]


def prose_lines(text: str):
    """(line number, line) for every line outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lowercase, punctuation other than hyphens
    and underscores removed, each space a hyphen."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in "-_ ")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file, duplicates numbered -1, -2, ... as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path):
    """(line number, target) of every relative link outside code."""
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        line = CODE_SPAN.sub(lambda m: "code", line)
        for m in LINK.finditer(line):
            target = m.group(2)
            if not target or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, mailto:, ...
                continue
            yield number, target


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where} (no heading with anchor #{anchor} in {dest.name})")
    return problems


def test_readme_is_a_front_door():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_LIMIT, f"README.md is {size} bytes; move detail into docs/ (limit {README_LIMIT})"


def test_docs_exist():
    assert (ROOT / "docs").is_dir()
    assert len(markdown_files()) > 5


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert broken_links(path) == []


def test_checker_finds_broken_links(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text(
        "# Title\n\n## Trackers: MLflow & W&B\n\n## Same\n\n## Same\n\n```bash\n# not a "
        "heading\n[x](nope.md)\n```\n"
        "[ok](#trackers-mlflow--wb) [ok](#same-1) [ok](a.md#title) [web](https://example.com/x#y)\n"
        "[bad](#same-2) [bad](#not-a-heading) [bad](missing.md) `[code](nope.md)`\n",
        encoding="utf-8",
    )
    problems = broken_links(tmp_path / "a.md")
    assert [p.split(": ", 1)[1].split(" (")[0] for p in problems] == [
        "#same-2",
        "#not-a-heading",
        "missing.md",
    ]


def test_slugs_follow_github():
    assert slug("Sweeps: `normbench sweep`") == "sweeps-normbench-sweep"
    assert slug("Trackers: MLflow and Weights & Biases") == "trackers-mlflow-and-weights--biases"
    assert slug("SLURM: hydra/launcher=slurm") == "slurm-hydralauncherslurm"
    assert slug("lr_sensitivity: each norm at its best learning rate (90 runs)") == (
        "lr_sensitivity-each-norm-at-its-best-learning-rate-90-runs"
    )
    assert slug("Per-run peak memory and `normbench --help` (issue 17)") == (
        "per-run-peak-memory-and-normbench---help-issue-17"
    )

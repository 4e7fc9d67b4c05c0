"""A claim's rule, fixed before its data: what the pilot may not change, and the commit that fixed it.

The rule is everything that decides a verdict except the values a pilot fixes: the sweep (grid,
corpus, size), the comparison (arms, metric, tuned key), the predicate (kind, margin, factor, trend
axis and direction; not its prose), the engagement rule and the fewest seeds. When a claim's pilot
starts, ``record`` writes ``rule.yaml`` beside its runs: the rule's fingerprint, the fingerprint of
the sweep it composes (every job's config hash: what the experiment file, the model size and every
default it reads make of it), the oldest commit of the claim's YAML since which that rule has not
changed (``rule_commit``) and the commit the pilot runs at. A verdict whose claim's rule differs from
the one its pilot ran under decides nothing: the claim is piloted again on fresh seeds (``changed``;
the sweep's fingerprint, which needs every job composed, is compared by ``claims check``).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import yaml

from normbench.core.fileio import write_atomic

FILE = "rule.yaml"
RULE_FIELDS = ("sweep", "compare", "engages", "min_seeds")


def rule_of(body: dict) -> dict:
    """The fields of a claim's YAML (as read) that make its rule; the predicate without its prose."""
    rule = {key: body.get(key) for key in RULE_FIELDS}
    rule["predicate"] = {k: v for k, v in (body.get("predicate") or {}).items() if k != "why"}
    scale = body.get("scale") or {}
    rule["scale"] = {"model": scale.get("model"), "larger": scale.get("larger")}
    return rule


def fingerprint(body: dict) -> str:
    return hashlib.sha256(json.dumps(rule_of(body), sort_keys=True, default=str).encode()).hexdigest()[:16]


def sweep_fingerprint(config_hashes: list[str]) -> str:
    """The fingerprint of a composed sweep: its jobs' config hashes, in any order."""
    return hashlib.sha256(json.dumps(sorted(config_hashes)).encode()).hexdigest()[:16]


def _git(folder: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def rule_commit(path: Path) -> str | None:
    """The oldest commit since which the claim's YAML at ``path`` has held its present rule (None outside
    git, or for a file not committed as it is)."""
    path = path.resolve()
    now = fingerprint(yaml.safe_load(path.read_text(encoding="utf-8")))
    log = _git(path.parent, "log", "--format=%h", "--", path.name)
    oldest = None
    for commit in (log or "").split():
        text = _git(path.parent, "show", f"{commit}:./{path.name}")
        try:
            then = yaml.safe_load(text) if text is not None else None
        except yaml.YAMLError:
            then = None
        if not isinstance(then, dict) or fingerprint(then) != now:
            break
        oldest = commit
    return oldest


def head(folder: Path) -> str | None:
    out = _git(folder, "rev-parse", "--short", "HEAD")
    return out.strip() if out else None


def read(folder: Path) -> dict | None:
    try:
        body = yaml.safe_load((folder / FILE).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return body if isinstance(body, dict) else None


def record(folder: Path, claim_path: Path, sweep: str | None = None) -> dict:
    """The rule a claim's pilot in ``folder`` runs under (``sweep``: its composed sweep's fingerprint),
    written when it starts and kept after."""
    if (kept := read(folder)) is not None:
        return kept
    body = yaml.safe_load(claim_path.read_text(encoding="utf-8"))
    rule = {
        "fingerprint": fingerprint(body),
        **({"sweep": sweep} if sweep else {}),
        "rule_commit": rule_commit(claim_path),
        "pilot_commit": head(claim_path.parent),
    }
    write_atomic(folder / FILE, yaml.safe_dump(rule, sort_keys=False))
    return rule


def changed(folder: Path, claim_path: Path, sweep: str | None = None) -> bool:
    """Whether the claim's rule today is not the one its pilot in ``folder`` ran under; with ``sweep``
    (the sweep's fingerprint today), whether the sweep it composes is not either (a pilot that recorded
    one)."""
    kept = read(folder)
    if kept is None:
        return False
    if kept.get("fingerprint") != fingerprint(yaml.safe_load(claim_path.read_text(encoding="utf-8"))):
        return True
    return sweep is not None and kept.get("sweep") not in (None, sweep)

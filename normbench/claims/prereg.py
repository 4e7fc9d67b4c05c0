"""A claim's pre-registration: prereg.yaml, written and committed before its confirmation runs.

It fixes what the confirmation may not choose after seeing its runs: each arm's value of the tuned
key (chosen on the pilot), the confirmation's seeds (disjoint from the pilot's) and their count (from
the power calculation, normbench.claims.power), the test, its level in the claim's family, the
direction the claim is tested in and its margin, and the pilot that fixed them (its seeds, values,
estimate and spread). The claim's YAML is fingerprinted: a claim changed after its pre-registration
no longer matches it, and its confirmation does not decide it.

    OUT/confirmations/ID/prereg.yaml     the pre-registration
    OUT/confirmations/ID/<run dirs>      the confirmation's runs
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from normbench.core.errors import ConfigError
from normbench.core.fileio import write_atomic

CONFIRMATIONS = "confirmations"  # below the registry's folder: one folder per pre-registered claim
FILE = "prereg.yaml"
SEED_BASE = 1000  # the confirmation's first seed, unless a pilot seed reaches it (then the next)


@dataclass
class Prereg:
    id: str
    claim_sha: str  # the claim YAML's fingerprint when pre-registered
    family: int  # the claims Holm corrects across
    level: float  # the level planned at: the family's first Holm level
    test: str
    direction: str  # what reads reproduced, and what reads not reproduced (the refutation named)
    margin: float  # the bound the difference is tested against (0, ±delta, log of a ratio)
    planned_n: int  # seeds per arm
    seeds: list[int]
    values: dict  # {"a": value, "b": value} of the tuned key; {} for a grid (stable_lr) or no tuning
    pilot: dict = field(default_factory=dict)  # seeds, values, estimate, spread, spread_planned, distance

    def pilot_text(self) -> str:
        """'seeds 0-2, train.lr a 0.01 b 0.003, spread 0.0106 (planned 0.0225)': claims.csv's pilot."""
        p = self.pilot
        seeds = p.get("seeds") or []
        said = f"seeds {min(seeds)}-{max(seeds)}" if seeds else "no seeds"
        if self.values:
            said += f", {p.get('key')} " + " ".join(f"{s} {v:g}" for s, v in self.values.items())
        return (
            f"{said}, spread {p.get('spread', float('nan')):.3g} (planned {p.get('spread_planned', 0):.3g})"
        )


def fingerprint(claim_path: Path) -> str:
    return hashlib.sha256(claim_path.read_bytes()).hexdigest()[:16]


def folder(registry: Path, claim_id: str) -> Path:
    return registry / CONFIRMATIONS / claim_id


def read(registry: Path, claim_id: str) -> Prereg | None:
    """The claim's pre-registration in ``registry``, None when it has none."""
    path = folder(registry, claim_id) / FILE
    if not path.is_file():
        return None
    try:
        body = yaml.safe_load(path.read_text(encoding="utf-8"))
        return Prereg(**body)
    except (yaml.YAMLError, TypeError) as err:
        raise ConfigError(f"{path}: not a pre-registration ({str(err).splitlines()[0]})") from None


def write(registry: Path, design: Prereg) -> Path:
    path = folder(registry, design.id) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, yaml.safe_dump(dataclasses.asdict(design), sort_keys=False))
    return path

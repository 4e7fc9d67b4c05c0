"""A claim's sweep composed before anything runs, and its comparison found in it.

``normbench claims check`` and ``normbench claims run`` (before it launches a job) compose the
claim's sweep as normbench's sweeper will (normbench.sweeps.planning.job_configs: the experiment's
grid and the claim's overrides, every comma list expanded into its jobs), and refuse, in one line
naming the claim's field:

- an override whose key the composed config lacks (``train.stepz``), with the key nearest to it;
- an arm (``compare.a``, ``compare.b``) that no job matches: a key no job's config has, or a value
  no job takes, with the values the sweep offers for it (the arm is matched as the verdict matches
  runs, normbench.claims.arms.arm, on the same columns normbench.report.load reads);
- a tuned key (``compare.tune``) or a trend's axis (``predicate.axis``) that takes one value in the
  sweep: there would be nothing to tune, or no trend to fit;
- a ``scale.model`` other than the model option the sweep's jobs compose (unless the user's own
  overrides choose the model: ``claims run ID model=small`` runs at the size asked for).

``compare.metric`` is checked with the rest of the YAML (normbench.claims.schema.METRIC_NAMES).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf, open_dict

from normbench.claims import rules
from normbench.claims.schema import Claim
from normbench.core.configtree import conf_dir
from normbench.core.errors import ConfigError, about, did_you_mean
from normbench.core.fileio import leaves
from normbench.core.identity import config_hash


@dataclass(frozen=True)
class Checked:
    jobs: int  # the sweep's runs
    models: tuple[str, ...]  # the conf/model options its jobs compose
    sweep: str  # the composed sweep's fingerprint (normbench.claims.rules.sweep_fingerprint)
    shapes: tuple[tuple, ...] = ()  # each job's shape (SHAPE): what its training time depends on most


SHAPE = ("model.n_layer", "model.d_model", "model.block_size", "train.steps", "train.batch_size")


def shape_of(row: dict) -> tuple:
    """A run's shape from its config's dotted keys: depth, width, context, steps and batch."""
    return tuple(row.get(key) for key in SHAPE)


def override_key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def claim_args(claim: Claim, overrides: list[str], config_dir: Path | None = None) -> list[str]:
    """The claim's sweep with the user's overrides (replacing the claim's value of a key they name),
    and the user's config folder on Hydra's search path."""
    given = {override_key(o) for o in overrides}
    args = [a for a in claim.sweep_args() if override_key(a) not in given]
    search = [f"hydra.searchpath=[file://{config_dir.resolve()}]"] if config_dir is not None else []
    return [*args, *overrides, *search]


def claim_config_dir(path: Path) -> Path | None:
    """The user's config folder a claim YAML sits in (CONFIG_DIR/claim/ID.yaml), None for normbench's."""
    folder = path.resolve().parent
    if folder.name != "claim" or folder.parent == conf_dir().resolve():
        return None
    return folder.parent


def job_row(cfg: DictConfig) -> dict:
    """A job's config as one row of the columns a run's verdict is matched on (normbench.report.load):
    every dotted key, and norm, placement and seed by name."""
    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.pop("hydra", None)
    config = OmegaConf.to_container(cfg, resolve=False)
    norm, placement = config.get("norm"), config.get("placement")
    return {
        **leaves(config, lists="json"),
        "norm": norm.get("name") if isinstance(norm, dict) else norm,
        "placement": placement.get("name") if isinstance(placement, dict) else placement,
        "seed": config.get("seed"),
    }


def _offered(column: pd.Series) -> str:
    values = sorted({str(v) for v in column}, key=lambda v: (_number(v) is None, _number(v) or 0, v))
    return ", ".join(values)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _check_arm(claim: Claim, field: str, spec: dict, jobs: pd.DataFrame) -> None:
    from normbench.claims.arms import arm

    for key in spec:
        if key not in jobs:
            raise ConfigError(
                f"{claim.path}: {field}.{key}: not a key of the sweep's config"
                f"{did_you_mean(key, jobs.columns) or '; normbench train --cfg job shows every key'}"
            )
    matched = jobs
    for key, value in spec.items():  # narrowed key by key: the first key that leaves no job is named
        narrowed = arm(matched, {key: value})
        if narrowed.empty:
            together = "" if len(matched) == len(jobs) else f" with {_pairs(spec, key)}"
            raise ConfigError(
                f"{claim.path}: {field}: no job of the sweep has {key}={value}{together}; "
                f"the sweep offers {key}={_offered(matched[key])}"
            )
        matched = narrowed


def _pairs(spec: dict, before: str) -> str:
    keys = list(spec)
    return " ".join(f"{k}={spec[k]}" for k in keys[: keys.index(before)])


def _check_varies(claim: Claim, field: str, key: str, jobs: pd.DataFrame, swept: list[str]) -> None:
    """``key`` takes two values or more in the sweep (and is not the seed); ``swept``: the keys it varies."""
    allowed = [*swept, *(["null"] if field == "compare.tune" else [])]
    if key == "seed":
        raise ConfigError(f"{claim.path}: {field}: the seed is what is repeated, not tuned", allowed=allowed)
    if key not in jobs:
        near = did_you_mean(key, jobs.columns)
        raise ConfigError(
            f"{claim.path}: {field}: {key} is not a key of the sweep's config{near}", allowed=allowed
        )
    values = jobs[key].astype(str).unique()
    if len(values) < 2:
        raise ConfigError(
            f"{claim.path}: {field}: the sweep runs {key} at one value ({values[0]})", allowed=allowed
        )


def _swept(configs: list, jobs: pd.DataFrame) -> list[str]:
    """The keys the sweep's overrides vary across its jobs, the seed left out."""
    keys = dict.fromkeys(o.split("=", 1)[0].lstrip("+~") for overrides, _ in configs for o in overrides)
    return [k for k in keys if k != "seed" and k in jobs and jobs[k].astype(str).nunique() > 1]


def check_claim(claim: Claim, overrides: list[str] = (), config_dir: Path | None = None) -> Checked:
    """Compose the claim's sweep (with the user's ``overrides``) and check its comparison against the
    jobs; ConfigError, one line naming the claim's field, on the first mistake."""
    from normbench.model import extensions
    from normbench.sweeps.planning import job_configs
    from normbench.training.config import checked

    extensions.install()  # installed packages' norms and placements are config options too
    config_dir = config_dir if config_dir is not None else claim_config_dir(claim.path)
    with about(f"{claim.path}: sweep"):
        configs = job_configs(claim_args(claim, list(overrides), config_dir))
    for job_overrides, cfg in configs:  # each job as training would check it: no run can fail its config
        _, why = checked(cfg)
        if why:
            raise ConfigError(f"{claim.path}: sweep: the job {' '.join(job_overrides)}: {why}")
    jobs = pd.DataFrame([job_row(cfg) for _, cfg in configs])
    for field, spec in (("compare.a", claim.a), ("compare.b", claim.b)):
        if spec:
            _check_arm(claim, field, spec, jobs)
    swept = _swept(configs, jobs)
    if claim.tune:
        _check_varies(claim, "compare.tune", claim.tune, jobs, swept)
    if claim.kind == "trend":
        _check_varies(claim, "predicate.axis", claim.predicate["axis"], jobs, swept)
    models = tuple(sorted({str(cfg.hydra.runtime.choices.get("model")) for _, cfg in configs}))
    if "model" not in {override_key(o) for o in overrides} and models != (claim.scale["model"],):
        ran = ",".join(models)
        raise ConfigError(
            f"{claim.path}: scale.model: '{claim.scale['model']}', but the sweep runs model={ran}"
        )
    hashes = [config_hash(cfg) for _, cfg in configs]
    return Checked(
        len(configs), models, rules.sweep_fingerprint(hashes), tuple(map(shape_of, jobs.to_dict("records")))
    )


def check_design(claim: Claim, registry: Path) -> None:
    """Refuse, in one line, a design that cannot decide at the level its family gives the claim (Holm's
    first level across the registry's rows, or across a user's own claims, the claim counted in it): an
    exact test whose smallest p at its seeds is above the level, an equivalence margin the pilot's spread
    cannot meet.
    The seeds are the claim's pre-registered count where it has one (normbench.claims.prereg), else
    its min_seeds."""
    from normbench.claims import power, prereg
    from normbench.claims.schema import load_registry

    # its family: normbench's registry, or the claims of the user's own config folder (never both)
    folder = claim_config_dir(claim.path)
    ids = {c.id for c in load_registry(folder) if claim_config_dir(c.path) == folder}
    family = len(ids | {claim.id})
    level = power.family_level(family)
    design = prereg.read(registry, claim.id)
    n = design.planned_n if design else claim.min_seeds
    spread = float(design.pilot.get("spread", math.nan)) if design else math.nan
    estimate = float(design.pilot.get("estimate", math.nan)) if design else math.nan
    if why := power.cannot_decide(claim.kind, n, level, claim.predicate.get("delta"), spread, estimate):
        raise ConfigError(f"{claim.path}: cannot decide at level {level:.3g} (Holm across {family}): {why}")

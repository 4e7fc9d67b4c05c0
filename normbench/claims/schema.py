"""A claim's YAML: its fields as typed records, their checks (one line naming the field), the registry.

    id: rms_matches_ln                  # the file's name without .yaml
    claim: RMSNorm reaches LayerNorm's loss ...   # one sentence, the source's own number in it
    source:
      kind: paper                       # paper, or article (the explainer articles normbench began from)
      authors: Biao Zhang, Rico Sennrich
      year: 2019                        # required for a paper
      arxiv: "1910.07467"               # required for a paper
      title: Root Mean Square Layer Normalization
      setting: Transformer NMT, WMT14 En-De   # the source's model size and data
    sweep:
      experiment: null                  # a conf/experiment/ name, or null
      overrides: [norm=ln,rms, "train.lr=3e-3,1e-2", "seed=0,1,2"]
    compare:
      a: {norm: rms}                    # the configuration the claim is about (config key: value)
      b: {norm: ln}                     # the one it is compared with (not for a trend of one arm)
      metric: final_val_loss            # a summary field (normbench.report.load.METRICS, max_attn_logit...)
      tune: train.lr                    # each arm at its own best value of this key; null: none
      log: false                        # compare log(metric): for quantities that grow by factors (logits)
    predicate:
      kind: equivalent                  # better, worse, not_worse, equivalent, trend, rate, steps_to_target,
                                        # stable_lr
      delta: 0.02                       # the margin (equivalent, not_worse; optional for better/worse)
      effect: null                      # better/worse: the effect the source reports, in the metric's
                                        # units; equivalence within delta refutes only when delta < effect
      why: three seeds at this size spread by about 0.005 nats ...
    scale:
      model: mini                       # the conf/model option every run of the sweep composes
      why: the smallest size where ...  # one sentence: why the claim can show at this size
      larger: midi                      # or null: a second size the claim is also decided at, its own
                                        # row ID@midi (the same sweep with model=midi; at least 3x the
                                        # parameters), the two rows' estimates read together (a trend)
    min_seeds: 3                        # fewer completed seeds per arm: inconclusive, no interval
    scale_dependent: null               # or the source's setting the verdict may not transfer to
    cost_s: null                        # the default sweep's measured seconds on a 2-core CPU
    note: null                          # what changed in the verdict since an earlier publication, and why
    engages: null                       # or {metric, reaches, arm, why}: the value one arm's runs must
                                        # reach for the treatment to act (normbench.claims.engagement)

The predicate's own fields: trend has ``axis`` (a size key), ``of`` (gap: a - b at each size;
best_value: a's per-seed best tuning value, in log2) and ``direction`` (increasing, decreasing,
flat with ``delta``); rate has ``direction`` (more, fewer: a's divergences against b's);
steps_to_target has ``below`` (the ratio of steps the claim bounds, 1: faster); stable_lr has
``factor`` (a's largest non-diverging value at least this multiple of b's).

``compare.metric`` is one of ``METRIC_NAMES``: the report's metrics and the summary fields a run
writes. ``normbench.claims.checking`` composes the sweep and checks the rest against its jobs: the
overrides' keys, each arm, the tuned key and the trend's axis, and ``scale.model``.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import yaml

from normbench.core.configtree import conf_dir, group_options
from normbench.core.errors import ConfigError, did_you_mean, first_line
from normbench.report.metrics import METRICS

DIFFERENCES = ("better", "worse", "not_worse", "equivalent")  # a - b of one number per seed
KINDS = ("better", "worse", "not_worse", "equivalent", "trend", "rate", "steps_to_target", "stable_lr")
SOURCE_KINDS = ("paper", "article")
TREND_OF = ("gap", "best_value")
TREND_DIRECTIONS = ("increasing", "decreasing", "flat")
RATE_DIRECTIONS = ("more", "fewer")
# The fields of each predicate kind beside its kind and why.
PREDICATE_FIELDS = {
    "better": ("delta", "effect"),
    "worse": ("delta", "effect"),
    "not_worse": ("delta",),
    "equivalent": ("delta",),
    "trend": ("axis", "of", "direction", "delta"),
    "rate": ("direction",),
    "steps_to_target": ("below",),
    "stable_lr": ("factor",),
}
# The predicates whose outcome is discrete (steps at an evaluation, a rate on a grid): an exact test
# decides them, and with n seeds its p is at least 2 / 2^n, so they need EXACT_SEEDS to reach 0.05.
EXACT = ("steps_to_target", "stable_lr")
EXACT_SEEDS = 6
# What compare.metric may name: the report's metrics (normbench.report.metrics), then the numeric fields
# of a run's summary.json a claim compares (the logit peaks, the causal-leak probe in each mode, the size).
METRIC_NAMES = (
    *METRICS,
    "max_attn_logit",
    "max_log_z",
    "max_attn_logit_raw",
    "max_log_z_raw",
    "causal_leak.train",
    "causal_leak.eval",
    "params",
    "flops_per_token",
    "lr_sensitivity",  # each seed's over the tuned key's grid (normbench.claims.predicates.lr_sensitivity)
)
ARXIV = re.compile(r"\d{4}\.\d{4,5}")
ID = re.compile(r"[a-z][a-z0-9_]*")


# A claim's YAML as typed records: each field's type, with what a wrong value is told it must be (for
# a choice: what the value is not), checked by ``_typed``; a field without a default is required.
# What depends on several fields is checked after (``parse_claim``).
@dataclass
class SourceFile:
    kind: Annotated[Literal[SOURCE_KINDS], "a source kind"]
    authors: Annotated[str, "the authors' names"]
    title: Annotated[str, "the source's title"]
    setting: Annotated[str, "the source's model size and data"]
    year: Annotated[int | None, "a year"] = None  # required for a paper
    arxiv: Annotated[str | None, 'an arXiv id in quotes, e.g. "1910.07467"'] = None  # required for a paper


@dataclass
class SweepFile:
    experiment: Annotated[str | None, "a conf/experiment/ name or null"] = None
    overrides: Annotated[list[str], "a list of KEY=VALUE strings"] = field(default_factory=list)


ARM = "a mapping of config keys to values, e.g. {norm: rms, placement: pre}"


@dataclass
class CompareFile:
    a: Annotated[dict, ARM]
    metric: Annotated[str, "a metric's name"]
    b: Annotated[dict | None, ARM] = None
    tune: Annotated[str | None, "a config key (train.lr) or null"] = None
    log: Annotated[bool, "true or false"] = False


@dataclass
class PredicateFile:
    kind: Annotated[Literal[KINDS], "a predicate"]
    why: Annotated[str | None, "one sentence of text"] = None
    delta: Annotated[float | None, "a positive number"] = None
    effect: Annotated[float | None, "a positive number"] = None
    axis: Annotated[str | None, "a size key, e.g. model.n_layer"] = None
    of: Annotated[Literal[TREND_OF] | None, "a trend statistic"] = None
    direction: Annotated[str | None, "a direction"] = None
    below: Annotated[float | None, "a positive number"] = None
    factor: Annotated[float | None, "a positive number"] = None


@dataclass
class ScaleFile:
    model: Annotated[str, "a conf/model option"]
    why: Annotated[str, "one sentence of text"]
    larger: Annotated[str | None, "null or a conf/model option"] = None


@dataclass
class EngagesFile:
    metric: Annotated[str, "a metric's name"]
    reaches: Annotated[float, "a number"]
    arm: Annotated[Literal[("a", "b")], "an arm"]
    why: Annotated[str, "one sentence of text"]


MIN_SEEDS = "an integer ≥ 2 (an interval needs two seeds)"


@dataclass
class ClaimFile:
    id: Annotated[str, "lower_snake_case text"]
    claim: Annotated[str, "one sentence of text"]
    source: Annotated[SourceFile, "a mapping"]
    sweep: Annotated[SweepFile, "a mapping"]
    compare: Annotated[CompareFile, "a mapping"]
    predicate: Annotated[PredicateFile, "a mapping"]
    scale: Annotated[ScaleFile, "a mapping"]
    min_seeds: Annotated[int, MIN_SEEDS] = 3
    scale_dependent: Annotated[str | None, "null or the source's setting, as text"] = None
    cost_s: Annotated[float | None, "null or a positive number of seconds"] = None
    note: Annotated[str | None, "null or text (what changed in the verdict, and why)"] = None
    engages: Annotated[EngagesFile | None, "null or a mapping"] = None


@dataclass(frozen=True)
class Claim:
    id: str
    claim: str
    source: dict
    experiment: str | None
    overrides: tuple[str, ...]
    a: dict
    b: dict | None
    metric: str
    tune: str | None
    log: bool
    predicate: dict
    min_seeds: int
    scale: dict  # model: the conf/model option the sweep runs at; why: one sentence; larger: or None
    scale_dependent: str | None
    cost_s: float | None
    path: Path = field(compare=False)
    note: str | None = None  # what changed in its verdict since an earlier publication, and why
    engages: dict | None = None  # what one arm must reach for the treatment to act (claims.engagement)
    size_of: str | None = None  # the claim whose larger size this row is (ID@SIZE), None for its own

    @property
    def kind(self) -> str:
        return self.predicate["kind"]

    @property
    def cites(self) -> str:
        """'Zhang & Sennrich 2019, arXiv 1910.07467': the source in a table cell."""
        s = self.source
        if s["kind"] == "article":
            return str(s["authors"]) + (f" {s['year']}" if s.get("year") else "")
        authors = str(s["authors"])
        others = authors.endswith(" and others")  # a long list: its first author
        names = [n.strip() for n in authors.removesuffix(" and others").split(",") if n.strip()]
        surnames = [n.split()[-1] for n in names]
        if others or len(surnames) > 2:
            who = f"{surnames[0]} et al."
        else:  # one author (or a team) in full, two by their surnames
            who = names[0] if len(names) == 1 else " & ".join(surnames)
        arxiv = f", arXiv {s['arxiv']}" if s.get("arxiv") else ""
        return f"{who} {s['year']}{arxiv}"

    def sweep_args(self) -> list[str]:
        """The Hydra overrides of the claim's default sweep."""
        return [*([f"experiment={self.experiment}"] if self.experiment else []), *self.overrides]

    def runs(self, extra: list[str] | tuple[str, ...] = ()) -> int:
        """The default sweep's number of runs: the product of its swept values (the experiment's grid
        with the claim's overrides replacing the keys they name); ``extra`` overrides replace them in turn
        (a confirmation's seeds and fixed values)."""
        params: dict[str, str] = {}
        if self.experiment:
            path = _experiment_path(self.experiment, self.path)
            body = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            grid = ((body.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
            params.update({str(k).lstrip("+"): str(v) for k, v in grid.items()})
        for override in [*self.overrides, *extra]:
            key, _, value = override.partition("=")
            params[key.lstrip("+")] = value
        total = 1
        for key, value in params.items():
            total *= _count(key, value)
        return total


def _count(key: str, value: str) -> int:
    """How many values one override sweeps: a comma list, range(a,b[,step]), glob(*) of a group."""
    value = value.strip()
    if m := re.fullmatch(r"range\((.*)\)", value):
        return len(range(*(int(float(x)) for x in m.group(1).split(","))))
    if value.startswith("glob("):
        return len(group_options(key))
    return len([v for v in value.split(",") if v.strip()]) if "," in value else 1


def _experiment_path(name: str, claim_path: Path) -> Path:
    """conf/experiment/NAME.yaml, or the user's, beside the claim's own claim/ folder."""
    for folder in (claim_path.parent.parent / "experiment", conf_dir() / "experiment"):
        if (folder / f"{name}.yaml").is_file():
            return folder / f"{name}.yaml"
    raise ConfigError(
        f"{claim_path}: sweep.experiment: no experiment '{name}'", allowed=group_options("experiment")
    )


def _user_options(claim_path: Path, group: str) -> list[str]:
    """The options of ``group`` in the config folder a user's claim is in (CONFIG_DIR/claim/ID.yaml)."""
    folder = claim_path.parent.parent / group
    return [p.stem for p in folder.glob("*.yaml")] if claim_path.parent.name == "claim" else []


def _fail(path: Path, where: str, what: str, allowed=None) -> None:
    raise ConfigError(f"{path}: {where}: {what}", allowed=allowed)


def _typed(path: Path, where: str, record: type, value):
    """``value`` as ``record`` (one of the records above), each field checked against its type; ``where``
    is its field ("" for the file itself)."""
    if not isinstance(value, dict):
        _fail(path, where or "the file", f"must be a mapping, not {type(value).__name__}")
    names = [f.name for f in dataclasses.fields(record)]
    unknown = [k for k in value if k not in names]
    if unknown:
        _fail(path, f"{where}.{unknown[0]}" if where else str(unknown[0]), "unknown field", allowed=names)
    hints, typed = typing.get_type_hints(record, include_extras=True), {}
    for f in dataclasses.fields(record):
        at = f"{where}.{f.name}" if where else f.name
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name not in value and not required:
            continue
        if value.get(f.name) in (None, "") and required:
            _fail(path, at, "missing")
        kind, what = typing.get_args(hints[f.name])  # Annotated[type, what a wrong value must be]
        typed[f.name] = _value(path, at, kind, value[f.name], what)
    return record(**typed)


def _value(path: Path, at: str, kind, value, what: str):
    """``value`` of the type ``kind`` (str, int, float, bool, a Literal, a list of text, a mapping, a
    record, or one of these or None), else one line saying what it must be."""
    options = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        if value is None:
            return None
        kind = next(k for k in options if k is not type(None))
        options = typing.get_args(kind)
    if typing.get_origin(kind) is Literal:
        if value not in options:
            _fail(path, at, f"{value!r} is not {what}", allowed=options)
        return value
    if dataclasses.is_dataclass(kind):
        return _typed(path, at, kind, value)
    fits = {
        str: isinstance(value, str),
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        dict: isinstance(value, dict),
        list[str]: isinstance(value, list) and all(isinstance(v, str) for v in value),
    }[kind]
    if not fits:
        _fail(path, at, f"must be {what}, not {value!r}")
    return float(value) if kind is float else value


def _positive(path: Path, where: str, value: float | None) -> float:
    if value is None or not value > 0:
        _fail(path, where, f"must be a positive number, not {value!r}")
    return value


def _config_key(key: str) -> bool:
    """Whether a run's config can hold ``key``: norm, placement, seed, a model or train field, or any
    key of the norm, placement and data groups (whose fields differ by option)."""
    group, _, leaf = key.partition(".")
    if group in ("model", "train"):
        fields = yaml.safe_load(
            (conf_dir() / group / ("micro.yaml" if group == "model" else "default.yaml")).read_text()
        )
        return leaf in fields
    return key in ("norm", "placement", "seed") or (group in ("norm", "placement", "data") and bool(leaf))


def _arm(path: Path, where: str, value: dict) -> dict:
    if not value:
        _fail(path, where, "must map config keys to values, e.g. {norm: rms, placement: pre}")
    for key, v in value.items():
        if isinstance(v, (dict, list)):
            _fail(path, f"{where}.{key}", f"must be one value, not {type(v).__name__}")
        if not _config_key(str(key)):
            _fail(
                path,
                f"{where}.{key}",
                "not a config key",
                allowed=["norm", "placement", "seed", "model.*", "train.*", "data.*"],
            )
    return {str(k): v for k, v in value.items()}


def parse_claim(path: Path) -> Claim:
    """Read and check one claim YAML; ConfigError names the file and the field on any mistake."""
    try:
        body = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: not readable YAML ({first_line(err, named=False)})") from None
    file = _typed(path, "", ClaimFile, body)
    source, sweep, compare, predicate, scale = (
        file.source,
        file.sweep,
        file.compare,
        file.predicate,
        file.scale,
    )
    if not ID.fullmatch(file.id):
        _fail(path, "id", f"{file.id!r} must be lower_snake_case (letters, digits, _)")
    if file.id != path.stem:
        _fail(path, "id", f"'{file.id}' must equal the file's name, '{path.stem}'")
    if source.kind == "paper" and not ARXIV.fullmatch(source.arxiv or ""):
        _fail(path, "source.arxiv", f"a paper needs its arXiv id (NNNN.NNNNN), not {source.arxiv!r}")
    if source.kind == "paper" and source.year is None:
        _fail(path, "source.year", "must be a year, not None")
    if not all("=" in o for o in sweep.overrides):
        _fail(path, "sweep.overrides", "must be a list of KEY=VALUE strings")
    if sweep.experiment is None and not sweep.overrides:
        _fail(path, "sweep", "needs an experiment or overrides")
    if sweep.experiment is not None:
        _experiment_path(sweep.experiment, path)
    a = _arm(path, "compare.a", compare.a)
    b = _arm(path, "compare.b", compare.b) if compare.b is not None else None
    if compare.metric not in METRIC_NAMES:
        near = did_you_mean(compare.metric, METRIC_NAMES)
        _fail(
            path,
            "compare.metric",
            f"{compare.metric!r} is not a metric normbench writes{near}",
            allowed=METRIC_NAMES,
        )
    given = {k: v for k, v in dataclasses.asdict(predicate).items() if v is not None}
    allowed = ("kind", "why", *PREDICATE_FIELDS[predicate.kind])
    if unknown := [k for k in body["predicate"] if k not in allowed]:
        _fail(path, f"predicate.{unknown[0]}", "unknown field", allowed=allowed)
    _check_predicate(path, predicate, b, compare.tune)
    if compare.metric == "lr_sensitivity" and not compare.tune:
        _fail(path, "compare.tune", "lr_sensitivity is read over the grid of a tuned key, by seed: give it")
    if compare.metric == "lr_sensitivity" and predicate.kind not in DIFFERENCES:
        _fail(path, "predicate.kind", f"lr_sensitivity compares two arms: not {predicate.kind}", DIFFERENCES)
    models = sorted({*group_options("model"), *_user_options(path, "model")})
    if scale.model not in models:
        _fail(path, "scale.model", f"{scale.model!r} is not a model size", allowed=models)
    if scale.larger is not None and scale.larger not in models:
        _fail(path, "scale.larger", f"{scale.larger!r} is not a model size", allowed=models)
    if scale.larger is not None and f"model={scale.model}" not in sweep.overrides:
        _fail(path, "scale.larger", f"a second size replaces the sweep's model={scale.model}: give it")
    if file.min_seeds < 2:
        _fail(path, "min_seeds", f"must be {MIN_SEEDS}, not {file.min_seeds!r}")
    if predicate.kind in EXACT and file.min_seeds < EXACT_SEEDS:
        _fail(
            path,
            "min_seeds",
            f"a {predicate.kind} outcome is discrete and judged by an exact test, whose p with n seeds "
            f"is at least 2 / 2^n: fewer than {EXACT_SEEDS} can never reach 0.05, so the claim could not "
            f"come out either way (got {file.min_seeds})",
        )
    if file.cost_s is not None:
        _positive(path, "cost_s", file.cost_s)
    if file.engages is not None and file.engages.metric not in METRIC_NAMES:
        _fail(
            path, "engages.metric", f"{file.engages.metric!r} is not a metric normbench writes", METRIC_NAMES
        )
    return Claim(
        id=file.id,
        claim=" ".join(file.claim.split()),
        source={k: v for k, v in dataclasses.asdict(source).items() if v is not None},
        experiment=sweep.experiment,
        overrides=tuple(sweep.overrides),
        a=a,
        b=b,
        metric=compare.metric,
        tune=compare.tune,
        log=compare.log,
        predicate=given,
        min_seeds=file.min_seeds,
        scale={"model": scale.model, "why": " ".join(scale.why.split()), "larger": scale.larger},
        scale_dependent=file.scale_dependent,
        cost_s=file.cost_s,
        path=path,
        note=None if file.note is None else " ".join(file.note.split()),
        engages=None if file.engages is None else dataclasses.asdict(file.engages),
    )


def _check_predicate(path: Path, p: PredicateFile, b: dict | None, tune: str | None) -> None:
    kind = p.kind
    if b is None and not (kind == "trend" and p.of == "best_value"):
        _fail(path, "compare.b", f"a {kind} predicate compares two arms: give b")
    if kind in ("equivalent", "not_worse") or p.delta is not None:
        _positive(path, "predicate.delta", p.delta)
    if p.effect is not None:
        _positive(path, "predicate.effect", p.effect)
    if kind == "trend":
        if p.axis is None:
            _fail(path, "predicate.axis", "a trend needs its size key, e.g. model.n_layer")
        if p.of is None:
            _fail(path, "predicate.of", "None is not a trend statistic", allowed=TREND_OF)
        if p.direction not in TREND_DIRECTIONS:
            _fail(path, "predicate.direction", f"{p.direction!r} is not a trend", allowed=TREND_DIRECTIONS)
        if p.direction == "flat" and p.delta is None:
            _fail(path, "predicate.delta", "a flat trend needs its margin")
        if p.of == "best_value" and not tune:
            _fail(path, "compare.tune", "a trend of the best value needs the key tuned")
    if kind == "rate" and p.direction not in RATE_DIRECTIONS:
        _fail(path, "predicate.direction", f"{p.direction!r} is not a rate claim", allowed=RATE_DIRECTIONS)
    if kind == "steps_to_target":
        _positive(path, "predicate.below", p.below)
    if kind == "stable_lr":
        _positive(path, "predicate.factor", p.factor)
        if not tune:
            _fail(path, "compare.tune", "a stable-LR claim needs the swept key (train.lr)")


def claim_folders(config_dir: Path | None) -> list[Path]:
    """normbench's conf/claim/, then the user's CONFIG_DIR/claim/."""
    folders = [conf_dir() / "claim"]
    if config_dir is not None:
        if not config_dir.is_dir():
            raise ConfigError(f"--config-dir {config_dir}: no such folder")
        folders.append(config_dir / "claim")
    return folders


def at_larger_size(claim: Claim) -> Claim:
    """The claim's row at its larger size, ID@SIZE: the same sweep and rule with model=SIZE."""
    size, at = claim.scale["larger"], f"model={claim.scale['model']}"
    return dataclasses.replace(
        claim,
        id=f"{claim.id}@{size}",
        overrides=tuple(f"model={size}" if o == at else o for o in claim.overrides),
        scale={**claim.scale, "model": size, "larger": None},
        size_of=claim.id,
    )


def load_registry(config_dir: Path | None = None) -> list[Claim]:
    """Every claim, normbench's then the user's, each checked, each followed by its row at a larger size
    where it has one; an id given twice is a mistake."""
    claims: dict[str, Claim] = {}
    for folder in claim_folders(config_dir):
        for path in sorted(folder.glob("*.yaml")):
            claim = parse_claim(path)
            if claim.id in claims:
                raise ConfigError(f"{path}: id: '{claim.id}' is already a claim ({claims[claim.id].path})")
            claims[claim.id] = claim
            if claim.scale["larger"]:
                larger = at_larger_size(claim)
                claims[larger.id] = larger
    return list(claims.values())


def select(claims: list[Claim], ids: list[str]) -> list[Claim]:
    by_id = {c.id: c for c in claims}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise ConfigError(f"no claim '{missing[0]}'", allowed=list(by_id))
    return [by_id[i] for i in ids]

"""A claim's YAML: its fields, their checks (one line naming the field), and the registry of them all.

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
    min_seeds: 3                        # fewer completed seeds per arm: inconclusive, no interval
    scale_dependent: null               # or the source's setting the verdict may not transfer to
    cost_s: null                        # the default sweep's measured seconds on a 2-core CPU
    note: null                          # what changed in the verdict since an earlier publication, and why

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

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from normbench.core.configtree import conf_dir, group_options
from normbench.core.errors import ConfigError, did_you_mean, first_line
from normbench.report.metrics import METRICS

KINDS = ("better", "worse", "not_worse", "equivalent", "trend", "rate", "steps_to_target", "stable_lr")
SOURCE_KINDS = ("paper", "article")
TREND_OF = ("gap", "best_value")
TREND_DIRECTIONS = ("increasing", "decreasing", "flat")
RATE_DIRECTIONS = ("more", "fewer")
# Every field of a claim, and which of them a user may leave out (with the default).
FIELDS = (
    "id",
    "claim",
    "source",
    "sweep",
    "compare",
    "predicate",
    "scale",
    "min_seeds",
    "scale_dependent",
    "cost_s",
    "note",
)
OPTIONAL = {"scale_dependent": None, "cost_s": None, "min_seeds": 3, "note": None}
SOURCE_FIELDS = ("kind", "authors", "year", "arxiv", "title", "setting")
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
SCALE_FIELDS = ("model", "why")
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
)
ARXIV = re.compile(r"\d{4}\.\d{4,5}")
ID = re.compile(r"[a-z][a-z0-9_]*")


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
    scale: dict  # model: the conf/model option the sweep runs at; why: one sentence
    scale_dependent: str | None
    cost_s: float | None
    path: Path = field(compare=False)
    note: str | None = None  # what changed in its verdict since an earlier publication, and why

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

    def runs(self) -> int:
        """The default sweep's number of runs: the product of its swept values (the experiment's grid
        with the claim's overrides replacing the keys they name)."""
        params: dict[str, str] = {}
        if self.experiment:
            path = _experiment_path(self.experiment, self.path)
            body = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            grid = ((body.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
            params.update({str(k).lstrip("+"): str(v) for k, v in grid.items()})
        for override in self.overrides:
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


def _mapping(path: Path, where: str, value, fields: tuple, required: tuple = ()) -> dict:
    """``value`` checked as a mapping of ``fields``; ``where`` is its field ("" for the file itself)."""
    if not isinstance(value, dict):
        _fail(path, where or "the file", f"must be a mapping, not {type(value).__name__}")
    unknown = [k for k in value if k not in fields]
    if unknown:
        _fail(path, f"{where}.{unknown[0]}" if where else str(unknown[0]), "unknown field", allowed=fields)
    for key in required:
        if value.get(key) in (None, ""):
            _fail(path, f"{where}.{key}" if where else key, "missing")
    return value


def _number(path: Path, where: str, value, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and value <= 0):
        _fail(path, where, f"must be a {'positive ' if positive else ''}number, not {value!r}")
    return float(value)


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


def _arm(path: Path, where: str, value) -> dict:
    if not isinstance(value, dict) or not value:
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
    body = _mapping(
        path, "", body, FIELDS, ("id", "claim", "source", "sweep", "compare", "predicate", "scale")
    )
    body = {**OPTIONAL, **body}
    cid = body["id"]
    if not isinstance(cid, str) or not ID.fullmatch(cid):
        _fail(path, "id", f"{cid!r} must be lower_snake_case (letters, digits, _)")
    if cid != path.stem:
        _fail(path, "id", f"'{cid}' must equal the file's name, '{path.stem}'")
    if not isinstance(body["claim"], str):
        _fail(path, "claim", "must be one sentence of text")
    source = _mapping(path, "source", body["source"], SOURCE_FIELDS, ("kind", "authors", "title", "setting"))
    if source["kind"] not in SOURCE_KINDS:
        _fail(path, "source.kind", f"'{source['kind']}' is not a source kind", allowed=SOURCE_KINDS)
    if source["kind"] == "paper" and not ARXIV.fullmatch(str(source.get("arxiv") or "")):
        _fail(path, "source.arxiv", f"a paper needs its arXiv id (NNNN.NNNNN), not {source.get('arxiv')!r}")
    if (source["kind"] == "paper" or source.get("year") is not None) and not isinstance(
        source.get("year"), int
    ):
        _fail(path, "source.year", f"must be a year, not {source.get('year')!r}")
    sweep = _mapping(path, "sweep", body["sweep"], ("experiment", "overrides"))
    experiment, overrides = sweep.get("experiment"), sweep.get("overrides") or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
        _fail(path, "sweep.overrides", "must be a list of KEY=VALUE strings")
    if experiment is None and not overrides:
        _fail(path, "sweep", "needs an experiment or overrides")
    if experiment is not None:
        _experiment_path(str(experiment), path)
    compare = _mapping(path, "compare", body["compare"], ("a", "b", "metric", "tune", "log"), ("a", "metric"))
    a = _arm(path, "compare.a", compare["a"])
    b = _arm(path, "compare.b", compare["b"]) if compare.get("b") is not None else None
    metric = compare["metric"]
    if metric not in METRIC_NAMES:
        near = did_you_mean(str(metric), METRIC_NAMES)
        _fail(
            path, "compare.metric", f"{metric!r} is not a metric normbench writes{near}", allowed=METRIC_NAMES
        )
    tune = compare.get("tune")
    if tune is not None and not isinstance(tune, str):
        _fail(path, "compare.tune", "must be a config key (train.lr) or null")
    if not isinstance(compare.get("log", False), bool):
        _fail(path, "compare.log", f"must be true or false, not {compare['log']!r}")
    predicate = body["predicate"]
    kind = predicate.get("kind") if isinstance(predicate, dict) else None
    if kind not in KINDS:
        _fail(path, "predicate.kind", f"{kind!r} is not a predicate", allowed=KINDS)
    predicate = _mapping(path, "predicate", predicate, ("kind", "why", *PREDICATE_FIELDS[kind]))
    _check_predicate(path, kind, predicate, b, tune)
    scale = _mapping(path, "scale", body["scale"], SCALE_FIELDS, SCALE_FIELDS)
    models = sorted({*group_options("model"), *_user_options(path, "model")})
    if scale["model"] not in models:
        _fail(path, "scale.model", f"{scale['model']!r} is not a model size", allowed=models)
    if not isinstance(scale["why"], str):
        _fail(path, "scale.why", "must be one sentence of text")
    min_seeds = body["min_seeds"]
    if isinstance(min_seeds, bool) or not isinstance(min_seeds, int) or min_seeds < 2:
        _fail(path, "min_seeds", f"must be an integer ≥ 2 (an interval needs two seeds), not {min_seeds!r}")
    if predicate["kind"] in EXACT and min_seeds < EXACT_SEEDS:
        _fail(
            path,
            "min_seeds",
            f"a {predicate['kind']} outcome is discrete and judged by an exact test, whose p with n seeds "
            f"is at least 2 / 2^n: fewer than {EXACT_SEEDS} can never reach 0.05, so the claim could not "
            f"come out either way (got {min_seeds})",
        )
    if body["scale_dependent"] is not None and not isinstance(body["scale_dependent"], str):
        _fail(path, "scale_dependent", "must be null or the source's setting, as text")
    if body["cost_s"] is not None:
        _number(path, "cost_s", body["cost_s"])
    if body["note"] is not None and not isinstance(body["note"], str):
        _fail(path, "note", "must be null or text: what changed in the verdict, and why")
    return Claim(
        id=cid,
        claim=" ".join(body["claim"].split()),
        source=dict(source),
        experiment=None if experiment is None else str(experiment),
        overrides=tuple(overrides),
        a=a,
        b=b,
        metric=compare["metric"],
        tune=tune,
        log=compare.get("log", False),
        predicate=dict(predicate),
        min_seeds=min_seeds,
        scale={"model": str(scale["model"]), "why": " ".join(scale["why"].split())},
        scale_dependent=body["scale_dependent"],
        cost_s=body["cost_s"],
        path=path,
        note=None if body["note"] is None else " ".join(body["note"].split()),
    )


def _check_predicate(path: Path, kind: str, p: dict, b: dict | None, tune: str | None) -> None:
    one_arm = kind == "trend" and p.get("of") == "best_value"
    if b is None and not one_arm:
        _fail(path, "compare.b", f"a {kind} predicate compares two arms: give b")
    if kind in ("equivalent", "not_worse") or p.get("delta") is not None:
        _number(path, "predicate.delta", p.get("delta"))
    if p.get("effect") is not None:
        _number(path, "predicate.effect", p.get("effect"))
    if kind == "trend":
        if not isinstance(p.get("axis"), str):
            _fail(path, "predicate.axis", "a trend needs its size key, e.g. model.n_layer")
        if p.get("of") not in TREND_OF:
            _fail(path, "predicate.of", f"{p.get('of')!r} is not a trend statistic", allowed=TREND_OF)
        if p.get("direction") not in TREND_DIRECTIONS:
            _fail(
                path,
                "predicate.direction",
                f"{p.get('direction')!r} is not a trend",
                allowed=TREND_DIRECTIONS,
            )
        if p["direction"] == "flat" and p.get("delta") is None:
            _fail(path, "predicate.delta", "a flat trend needs its margin")
        if p["of"] == "best_value" and not tune:
            _fail(path, "compare.tune", "a trend of the best value needs the key tuned")
    if kind == "rate" and p.get("direction") not in RATE_DIRECTIONS:
        _fail(
            path,
            "predicate.direction",
            f"{p.get('direction')!r} is not a rate claim",
            allowed=RATE_DIRECTIONS,
        )
    if kind == "steps_to_target":
        _number(path, "predicate.below", p.get("below"))
    if kind == "stable_lr":
        _number(path, "predicate.factor", p.get("factor"))
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


def load_registry(config_dir: Path | None = None) -> list[Claim]:
    """Every claim, normbench's then the user's, each checked; an id given twice is a mistake."""
    claims: dict[str, Claim] = {}
    for folder in claim_folders(config_dir):
        for path in sorted(folder.glob("*.yaml")):
            claim = parse_claim(path)
            if claim.id in claims:
                raise ConfigError(f"{path}: id: '{claim.id}' is already a claim ({claims[claim.id].path})")
            claims[claim.id] = claim
    return list(claims.values())


def select(claims: list[Claim], ids: list[str]) -> list[Claim]:
    by_id = {c.id: c for c in claims}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise ConfigError(f"no claim '{missing[0]}'", allowed=list(by_id))
    return [by_id[i] for i in ids]

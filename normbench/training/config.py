"""The typed configs of a run, and from a composed Hydra config to them.

Hydra composes ``conf/`` (groups: norm, placement, model, data, train, experiment;
``normbench.core.configtree`` finds the tree); this module turns the composed ``DictConfig`` into
``ModelConfig``, ``DataConfig`` and ``TrainConfig`` dataclasses, so a wrong type or an out-of-range value
becomes one clear ``ConfigError`` before anything trains. A config's identity, ``config_hash``,
lives in ``normbench.core.identity``.

``TrainConfig`` and ``RunConfig`` are defined here; ``ModelConfig`` lives in normbench.model.gpt and the
data schemas in normbench.data.corpus. The model and the data sit below training and never import it
(imports flow one way), and their configs' validation reads their own package's tables (the
architectures, the norms, the corpora): defined here, they could not be imported by the code they
configure. Each typed config thus has one home that every user imports without a cycle, and this
module is where they meet.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from normbench.core.configtree import conf_dir, default_option, group_options
from normbench.core.devices import PRECISIONS
from normbench.core.errors import ConfigError, first_line, unknown_key
from normbench.core.identity import NOT_HASHED, config_hash
from normbench.data.corpus import DATA_SCHEMAS, DataConfig
from normbench.model.gpt import ModelConfig
from normbench.model.impls import NormImpl
from normbench.model.norms import check_norm
from normbench.model.placements import placement_options
from normbench.training.sinks import logger_options

RESUME = ("auto", "never")
COMPILE = (False, True, "auto", "cuda")
END_CHECKS = ("auto", True, False)


@dataclass
class TrainConfig:
    """The training loop's settings. No defaults here: conf/train/default.yaml holds them (one place)."""

    steps: int
    batch_size: int  # the optimizer's batch, whatever the micro-batches it is computed in
    # sequences per forward and backward (per device): the batch's gradients accumulated over
    # batch_size / micro_batch_size / devices of them; None: the whole batch in one
    micro_batch_size: int | None
    lr: float
    min_lr: float
    warmup_steps: int
    weight_decay: float
    beta1: float
    beta2: float
    grad_clip: float  # 0 turns clipping off
    eval_every: int
    eval_batches: int
    log_every: int
    stats_every: int  # per-layer statistics at step 0 and every N steps; 0 turns them off
    # FLOP/s per device for MFU; None: a listed GPU's datasheet peak, else a measured matmul peak
    peak_flops: float | None
    precision: str
    device: str
    threads: int  # 0 leaves PyTorch's default
    diverge_threshold: float | None  # default 3 x ln(vocab size)
    progress: bool
    # torch.compile the model for training and evals: true must compile (a failure is an error), auto falls
    # back to eager with a message, cuda is auto on a CUDA device and false elsewhere, false does not compile
    compile: Any
    tf32: bool  # TF32 matmuls on CUDA for fp32 runs (Ampere and newer)
    checkpoint_every: int | None  # steps between checkpoints; None: by checkpoint_minutes; 0 turns them off
    checkpoint_minutes: float  # wall time between checkpoints where checkpoint_every is None
    resume: str  # auto: continue from the run directory's checkpoint of this config; never: start fresh
    save_model: bool  # keep the final weights as model.pt
    z_loss: float  # coefficient of z-loss, mean(log(Z)^2) added to the loss (PaLM: 1e-4); 0 turns it off
    # trained with the other seeds of its config as one batched model (normbench.training.batched)
    batched: bool
    # the causality probe and the skip-one-layer evals at the end: true, false, or auto (those that fit in
    # a few percent of the run's time: normbench.training.summary)
    end_checks: Any

    def validate(self) -> None:
        for key in ("steps", "batch_size", "eval_every", "eval_batches", "log_every"):
            if getattr(self, key) < 1:
                raise ConfigError(f"train.{key} must be a positive integer, got {getattr(self, key)}")
        for key in (
            "lr",
            "min_lr",
            "weight_decay",
            "grad_clip",
            "warmup_steps",
            "threads",
            "stats_every",
            "z_loss",
        ):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"train.{key} must be >= 0, got {getattr(self, key)}")
        if self.lr == 0:
            raise ConfigError("train.lr must be > 0")
        if self.min_lr > self.lr:
            raise ConfigError(f"train.min_lr={self.min_lr} is above train.lr={self.lr}")
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"train.{key} must be in [0, 1), got {getattr(self, key)}")
        if self.checkpoint_every is not None and self.checkpoint_every < 0:
            raise ConfigError(
                f"train.checkpoint_every must be >= 0 (0 turns checkpoints off), got {self.checkpoint_every}"
            )
        if self.micro_batch_size is not None and not 0 < self.micro_batch_size <= self.batch_size:
            raise ConfigError(
                f"train.micro_batch_size must be in 1..train.batch_size={self.batch_size} (null: the whole "
                f"batch), got {self.micro_batch_size}"
            )
        if self.micro_batch_size and self.batch_size % self.micro_batch_size:
            raise ConfigError(
                f"train.micro_batch_size={self.micro_batch_size} must divide "
                f"train.batch_size={self.batch_size}"
            )
        if not self.checkpoint_minutes > 0:
            raise ConfigError(f"train.checkpoint_minutes must be > 0, got {self.checkpoint_minutes}")
        if self.end_checks not in END_CHECKS:
            raise ConfigError(
                f"unknown train.end_checks '{self.end_checks}'", allowed=["auto", "true", "false"]
            )
        if self.resume not in RESUME:
            raise ConfigError(f"unknown train.resume '{self.resume}'", allowed=RESUME)
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown train.precision '{self.precision}'", allowed=list(PRECISIONS))
        if self.compile not in COMPILE:
            raise ConfigError(
                f"unknown train.compile '{self.compile}'", allowed=["false", "true", "auto", "cuda"]
            )

    def compiles_on(self, device) -> bool:
        """Whether this run torch.compiles its model on ``device`` (train.compile=cuda: on CUDA only)."""
        if self.batched:  # the batched seeds vmap their step (normbench.training.batched)
            return False
        return self.compile in (True, "auto") or (self.compile == "cuda" and device.type == "cuda")


@dataclass
class RunConfig:
    seed: int
    norm: dict
    placement: dict
    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    # chosen logger -> its options (normbench.training.sinks); JSONL is always on
    logger: dict = field(default_factory=dict)
    sweep: str | None = None  # the sweep this run belongs to, if any: trackers group its runs by it
    source: DictConfig | None = None  # the composed config it was parsed from: config.yaml's content
    config_hash: str | None = None  # the run's identity (see config_hash): a checkpoint must match it
    norm_impl: NormImpl = NormImpl.AUTO  # norm.impl: which implementation the norms run


# Typed configs by their group's content: a sweep's plan checks every job, and most jobs share
# their model and data groups (and their train group but for train.lr): OmegaConf's typed merge
# is the slow part of checking a config.
_TYPED: dict[tuple, object] = {}


def _typed(schema, node, group: str):
    try:
        # resolved here, within the whole config: an interpolation may read another group
        # (model.init follows placement.init), which the merge below, on this node alone, could not
        node = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        key = (schema, json.dumps(node, sort_keys=True))
    except (OmegaConfBaseException, TypeError, ValueError):
        key = None  # the merge below says what is wrong
    if key in _TYPED:
        return copy.deepcopy(_TYPED[key])
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
        typed = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or ""
        if (
            isinstance(err, (ConfigKeyError, ConfigAttributeError)) and key
        ):  # a key the schema lacks, added with +KEY=VALUE
            raise ConfigError(unknown_key(f"{group}.{key}", [f.name for f in fields(schema)])) from None
        reason = first_line(err, named=False)
        raise ConfigError(f"{group}.{key}: {reason}" if key else f"{group}: {reason}") from None
    if key is not None:
        _TYPED[key] = copy.deepcopy(typed)
    return typed


def _data_schema(name) -> type:
    if name not in DATA_SCHEMAS:
        raise ConfigError(f"unknown data '{name}'", allowed=sorted(DATA_SCHEMAS))
    return DATA_SCHEMAS[name]


def load_group(group: str, option: str | None = None, **overrides):
    """One group's typed config from its YAML in conf/, as the CLI would build it, with ``overrides``.

    For building parts in Python (tests, notebooks) with the same defaults as the CLI:
    ``load_group("model", "micro", n_layer=3)``. ``option`` defaults to the root config's choice.
    """
    option = option or default_option(group)
    node = OmegaConf.merge(OmegaConf.load(conf_dir() / group / f"{option}.yaml"), overrides)
    schema = {"model": ModelConfig, "train": TrainConfig}.get(group) or _data_schema(node.get("name"))
    return _typed(schema, node, group)


def parse_config(cfg: DictConfig, cfg_hash: str | None = None) -> RunConfig:
    """Validate everything that can be checked before training starts; ``cfg_hash``: its config_hash, if
    known."""
    norm = OmegaConf.to_container(cfg.norm, resolve=True)
    # not a norm's option: the same for every norm, chosen here (the norms read it from normbench.model.impls)
    norm_impl = NormImpl(str(norm.pop("impl", "auto")))  # an unknown one is a ConfigError
    placement = OmegaConf.to_container(cfg.placement, resolve=True)
    check_norm(norm.get("name"), {k: v for k, v in norm.items() if k != "name"})
    placement_options(placement)  # an unknown placement, option or option value fails here
    try:
        seed = int(cfg.seed)
    except (TypeError, ValueError):
        raise ConfigError(f"seed must be an integer, got {cfg.seed!r}") from None
    loggers = OmegaConf.to_container(cfg.logger, resolve=True) if cfg.get("logger") else {}
    run = RunConfig(
        seed=seed,
        norm=norm,
        placement=placement,
        model=_typed(ModelConfig, cfg.model, "model"),
        data=_typed(_data_schema(cfg.data.get("name")), cfg.data, "data"),
        train=_typed(TrainConfig, cfg.train, "train"),
        logger={
            name: _typed(options, loggers[name] or {}, f"logger.{name}")
            for name, options in logger_options(list(loggers)).items()
        },
        config_hash=cfg_hash or config_hash(cfg),
        norm_impl=norm_impl,
        source=cfg,
    )
    run.model.validate()
    run.train.validate()
    return run


def checked(cfg: DictConfig, cfg_hash: str | None = None) -> tuple[RunConfig | None, str | None]:
    """(the run's config, None), or (None, why it cannot run): a sweep's plan and its batching ask this
    of every job, and go on past one that cannot (it fails as its own run); a single run's gate stops
    at it before Hydra writes anything."""
    try:
        return parse_config(cfg, cfg_hash), None
    except ConfigError as err:
        return None, str(err)


__all__ = ["NOT_HASHED", "RunConfig", "conf_dir", "config_hash", "group_options", "parse_config"]

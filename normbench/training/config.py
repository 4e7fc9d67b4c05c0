"""From a composed Hydra config to the typed configs each component owns.

Hydra composes ``conf/`` (groups: norm, placement, model, data, train, experiment;
``normbench.core.configtree`` finds the tree); this module turns the composed ``DictConfig`` into
``ModelConfig``, ``DataConfig`` and ``TrainConfig`` dataclasses, so a wrong type or an out-of-range value
becomes one clear ``ConfigError`` before anything trains. A config's identity, ``config_hash``,
lives in ``normbench.core.identity``.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, fields

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from normbench.core.configtree import conf_dir, default_option, group_options
from normbench.core.errors import ConfigError, unknown_key
from normbench.core.identity import NOT_HASHED, config_hash
from normbench.data.corpus import DATA_SCHEMAS, DataConfig
from normbench.model.gpt import ModelConfig
from normbench.model.impls import NormImpl
from normbench.model.norms import check_norm
from normbench.model.placements import placement_options
from normbench.training.loop import TrainConfig
from normbench.training.sinks import logger_options


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
        key = (schema, json.dumps(OmegaConf.to_container(node, resolve=True), sort_keys=True))
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
        reason = str(err).splitlines()[0]
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


__all__ = ["NOT_HASHED", "RunConfig", "conf_dir", "config_hash", "group_options", "parse_config"]

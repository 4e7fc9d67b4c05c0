"""From a composed Hydra config to the typed configs each component owns.

Hydra composes ``conf/`` (groups: norm, placement, model, data, train, experiment;
``normbench.configtree`` finds the tree); this module turns the composed ``DictConfig`` into ``ModelConfig``, ``DataConfig`` and
``TrainConfig`` dataclasses, so a wrong type or an out-of-range value becomes one
clear ``ConfigError`` before anything trains. It also owns a config's identity:
``config_hash``, the fingerprint that names sweep jobs and tells a stored result
from a different one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from normbench.configtree import conf_dir, group_options
from normbench.data import DataConfig
from normbench.errors import ConfigError
from normbench.model import ModelConfig
from normbench.norms import NORMS
from normbench.placements import PLACEMENTS, placement_options
from normbench.sinks import logger_options
from normbench.train import TrainConfig


@dataclass
class RunConfig:
    seed: int
    norm: dict
    placement: dict
    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    logger: dict = field(default_factory=dict)  # chosen logger -> its options (normbench.sinks); JSONL is always on
    sweep: str | None = None  # the sweep this run belongs to, if any: trackers group its runs by it
    config_hash: str | None = None  # the run's identity (see config_hash): a checkpoint must match it


def _typed(schema, node, group: str):
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or ""
        reason = str(err).splitlines()[0]
        raise ConfigError(f"{group}.{key}: {reason}" if key else f"{group}: {reason}") from None


def parse_config(cfg: DictConfig) -> RunConfig:
    """Validate everything that can be checked before training starts."""
    norm = OmegaConf.to_container(cfg.norm, resolve=True)
    placement = OmegaConf.to_container(cfg.placement, resolve=True)
    if norm.get("name") not in NORMS:
        raise ConfigError(f"unknown norm '{norm.get('name')}'", allowed=sorted(NORMS))
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
        data=_typed(DataConfig, cfg.data, "data"),
        train=_typed(TrainConfig, cfg.train, "train"),
        logger={name: _typed(options, loggers[name] or {}, f"logger.{name}")
                for name, options in logger_options(list(loggers)).items()},
        config_hash=config_hash(cfg),
    )
    run.model.validate()
    run.train.validate()
    return run


# Keys that say how or where a run goes, not what it computes: the same run with a progress
# bar or more threads, under another results root, or mirrored to another tracker, is still the same run.
# Checkpoint cadence, resuming and keeping the weights don't change what a run computes either.
NOT_HASHED = ("results_dir", "train.progress", "train.threads", "logger",
              "train.checkpoint_every", "train.resume", "train.save_model")


def config_hash(cfg: DictConfig) -> str:
    """A stable fingerprint of what a run computes: the resolved config without Hydra's node and NOT_HASHED."""
    # Drop the hydra node before resolving: it may hold ${config_hash:} itself (the sweep subdir).
    plain = OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True)
    for dotted in NOT_HASHED:
        *parents, leaf = dotted.split(".")
        node = plain
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:16]


# ${config_hash:} in a Hydra config (conf/config.yaml names sweep jobs' directories with it), so a
# job's directory follows from its config: the same config lands in the same directory whatever
# the order or spelling of the overrides. Registered on import, which every Hydra job process
# does (it unpickles normbench.job.hydra_main, which imports this module).
if not OmegaConf.has_resolver("config_hash"):
    OmegaConf.register_new_resolver("config_hash", lambda *, _root_: config_hash(_root_)[:8])


__all__ = ["RunConfig", "parse_config", "config_hash", "NOT_HASHED", "conf_dir", "group_options", "NORMS", "PLACEMENTS"]

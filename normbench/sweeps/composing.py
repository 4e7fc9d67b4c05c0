"""A sweep job's config, composed as Hydra composes it, but once per choice of config groups.

Hydra composes every job of a multirun from scratch (``ConfigLoader.load_sweep_config``): a fifth
of a second each on a 2-core machine, which for a 90-run grid of 3-second runs is a tenth of the
sweep. Most of a grid's jobs differ only in plain key changes (``train.lr=0.01 seed=2``), which
Hydra applies after composing. ``compose`` composes once per choice of groups (``norm=rms
model=micro``, plus the sweep's own hydra overrides) through the loader's public
``load_sweep_config``, then applies a job's key changes to a copy and fills in the two fields Hydra
derives from the overrides (``hydra.overrides.task``, ``hydra.job.override_dirname``: Hydra's
public API has no function for them). That derivation is checked against what Hydra returns for
each base: where the two differ, every job of that choice of groups goes through Hydra whole, as
does anything else (``+key``, ``~key``, a key the composed config lacks).

normbench's sweeper (the plan) and its local launcher call it in the same process, so the launcher
finds every choice of groups composed; the launcher's workers get each job's composed config
and compose nothing (``normbench.sweeps.launching``).
"""

from __future__ import annotations

import copy
import re

from hydra.core.config_loader import ConfigLoader
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from omegaconf import DictConfig, OmegaConf, open_dict

_ABSENT = object()
_bases: dict[tuple, DictConfig | None] = {}  # None: the derivation here is not Hydra's for this base
_groups: dict[
    str, set[str]
] = {}  # a parent group's child groups: the config tree does not change in a process


def compose(loader: ConfigLoader, master: DictConfig, overrides: list[str]) -> DictConfig:
    """The job's config, as ``loader.load_sweep_config(master, overrides)`` composes it."""
    parsed = OverridesParser.create(config_loader=loader).parse_overrides(overrides)
    groups = [o for o in parsed if o.is_hydra_override() or _is_group(loader, o.key_or_group)]
    keys = [o for o in parsed if o not in groups]
    if not all(_plain_change(o) for o in keys):
        return loader.load_sweep_config(master, overrides)
    key = (
        str(master.hydra.job.config_name),
        tuple(OmegaConf.to_container(master.hydra.overrides.hydra)),
        tuple(o.input_line for o in groups),
    )
    if key not in _bases:
        base = loader.load_sweep_config(master, [o.input_line for o in groups])
        hydras = (OmegaConf.to_container(base.hydra.overrides.task), base.hydra.job.override_dirname)
        _bases[key] = base if _derived(base, groups) == hydras else None
    if _bases[key] is None:
        return loader.load_sweep_config(master, overrides)
    cfg = copy.deepcopy(_bases[key])
    if any(OmegaConf.select(cfg, o.key_or_group, default=_ABSENT) is _ABSENT for o in keys):
        return loader.load_sweep_config(master, overrides)  # Hydra's own error message
    for o in keys:
        OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
    task, dirname = _derived(cfg, parsed)
    with open_dict(cfg.hydra):
        cfg.hydra.overrides.task = task
        cfg.hydra.job.override_dirname = dirname
    OmegaConf.copy_cache(from_config=master, to_config=cfg)
    return cfg


def _derived(cfg: DictConfig, overrides: list[Override]) -> tuple[list[str], str]:
    """``hydra.overrides.task`` and ``hydra.job.override_dirname`` as Hydra derives them from a job's
    overrides: the task's own overrides, and those sorted (less ``exclude_keys``), ``=`` as kv_sep."""
    app = [o for o in overrides if not o.is_hydra_override()]
    how = cfg.hydra.job.config.override_dirname
    lines = sorted(o.input_line for o in app if o.key_or_group not in how.exclude_keys)
    return [o.input_line for o in app], re.sub("=", how.kv_sep, how.item_sep.join(lines))


def _plain_change(o: Override) -> bool:
    return (
        o.type == OverrideType.CHANGE
        and not (o.is_add() or o.is_force_add() or o.is_delete())
        and o.package is None
    )


def _is_group(loader: ConfigLoader, name: str) -> bool:
    parent, _, leaf = name.rpartition("/")
    if parent not in _groups:
        _groups[parent] = set(loader.list_groups(parent))
    return leaf in _groups[parent]

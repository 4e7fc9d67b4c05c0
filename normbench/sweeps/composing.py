"""Hydra's per-job work in a sweep, done once: composition per choice of config groups, the plugin scan per
process.

Hydra composes every job of a multirun from scratch, twice (the sweeper checks the batch,
then the launcher composes each job again): a fifth of a second each on a 2-core machine,
which for a 90-run grid of 3-second runs is a tenth of the sweep. Most of a grid's jobs
differ from each other only in plain key changes (``train.lr=0.01 seed=2``), which Hydra
applies after composing. ``install()`` makes Hydra's ``ConfigLoaderImpl.load_sweep_config``
compose once per choice of groups (``norm=rms model=micro``, plus the sweep's own hydra
overrides), then apply a job's key changes to a copy and fill in the fields Hydra derives
from them (``hydra.overrides.task``, ``hydra.job.override_dirname``), exactly as Hydra does.
Anything else (``+key``, ``~key``, a key the composed config lacks) goes through Hydra
whole. tests/test_sweep.py checks the two give the same config for every job of a grid. (The
sweeper's check is skipped altogether in the multirun child: the plan has made it,
``normbench.sweeps.multirun.leave_batch_check_to_the_plan``.) The plan composes every choice of groups
before any job starts, and the sweep hands what it composed to its job processes (``share``:
a pickle in a directory of the multirun child's own, named by SHARED_ENV), so that a worker does
not compose them all again: a tenth of a second each, per worker.

Hydra's launchers also hand every job the launcher's singletons without the plugin registry
(``Singleton.get_state`` drops it), and ``Singleton.set_state`` scans the plugins again, which
executes every plugin module once more: a twentieth of a second a job. ``install()`` keeps the
process's first scan: the installed plugins do not change while a worker lives.

Installed in the sweep's processes only: ``normbench.sweeps.sweep`` (the plan, the multirun's
child) and ``normbench.sweeps.job`` (which every launcher's worker imports to run a job).
Pinned to Hydra 1.3's internals, as the plan's use of its basic sweeper is (pyproject.toml).
"""

from __future__ import annotations

import copy
import functools
import os
import pickle
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from normbench.core.fileio import write_atomic

_ABSENT = object()
_bases: dict[tuple, DictConfig] = {}
SHARED_ENV = "NORMBENCH_COMPOSED"  # the file of a sweep's composed configs its job processes read (share())


def shared_bytes() -> bytes:
    """What this process has composed (the sweep's plan composes every choice of groups), for ``share``;
    empty when it does not pickle (a structured config's class that a plugin scan has replaced since):
    the job processes then compose it themselves."""
    try:
        return pickle.dumps({"cwd": os.getcwd(), "bases": _bases})
    except (pickle.PicklingError, TypeError, AttributeError):
        return b""


def share(blob: bytes) -> None:
    """Write ``shared_bytes`` where this process's job processes find it (SHARED_ENV: a file in a
    directory of the sweep's own, normbench.sweeps.multirun), so that each need not compose every choice of
    groups again: a tenth of a second each."""
    write_atomic(Path(os.environ[SHARED_ENV]), blob)


@functools.cache  # once per process: at its first choice of groups not composed yet
def _adopt_shared() -> None:
    path = os.environ.get(SHARED_ENV)
    try:
        shared = pickle.loads(Path(path).read_bytes()) if path else None
    except (OSError, pickle.UnpicklingError, EOFError):
        return  # not written (the plan was not shared): compose here
    if shared and shared["cwd"] == os.getcwd():  # Hydra records the working directory in the config
        for key, base in shared["bases"].items():
            _bases.setdefault(key, base)


def install() -> None:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    if getattr(ConfigLoaderImpl.load_sweep_config, "normbench", False):
        return
    hydras_own = ConfigLoaderImpl.load_sweep_config

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        return _compose(self, master_config, list(sweep_overrides), hydras_own)

    load_sweep_config.normbench = True
    load_sweep_config.hydras_own = hydras_own
    ConfigLoaderImpl.load_sweep_config = load_sweep_config
    _keep_plugins()


def _keep_plugins() -> None:
    from hydra.core.plugins import Plugins
    from hydra.core.singleton import Singleton

    hydras_own = Singleton.set_state

    def set_state(state: dict) -> None:
        plugins = Singleton._instances.get(Plugins)
        if plugins is not None and Plugins not in state["instances"]:
            state = {**state, "instances": {**state["instances"], Plugins: plugins}}
        hydras_own(state)

    Singleton.set_state = staticmethod(set_state)


def _compose(loader, master: DictConfig, overrides: list[str], hydras_own) -> DictConfig:
    from hydra._internal.config_loader_impl import get_overrides_dirname
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    parsed = OverridesParser.create(config_loader=loader).parse_overrides(overrides)
    groups = [o for o in parsed if o.is_hydra_override() or loader.repository.group_exists(o.key_or_group)]
    keys = [o for o in parsed if o not in groups]
    if not all(
        o.type == OverrideType.CHANGE
        and not (o.is_add() or o.is_force_add() or o.is_delete())
        and o.package is None
        for o in keys
    ):
        return hydras_own(loader, master, overrides)
    key = (
        str(master.hydra.job.config_name),
        tuple(OmegaConf.to_container(master.hydra.overrides.hydra)),
        tuple(o.input_line for o in groups),
    )
    if key not in _bases:
        _adopt_shared()
    if key not in _bases:
        _bases[key] = hydras_own(loader, master, [o.input_line for o in groups])
    cfg = copy.deepcopy(_bases[key])
    if any(OmegaConf.select(cfg, o.key_or_group, default=_ABSENT) is _ABSENT for o in keys):
        return hydras_own(loader, master, overrides)  # Hydra's own error message
    for o in keys:
        OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
    app = [o for o in parsed if not o.is_hydra_override()]
    dirname = cfg.hydra.job.config.override_dirname
    with open_dict(cfg.hydra):
        cfg.hydra.overrides.task = [o.input_line for o in app]
        cfg.hydra.job.override_dirname = get_overrides_dirname(
            overrides=app, kv_sep=dirname.kv_sep, item_sep=dirname.item_sep, exclude_keys=dirname.exclude_keys
        )
    OmegaConf.copy_cache(from_config=master, to_config=cfg)
    return cfg

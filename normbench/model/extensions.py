"""Norms and placements from installed packages: the entry-point groups ``normbench.norms`` and
``normbench.placements``, registered beside the built-ins and offered to Hydra as config options.

A package declares, in its pyproject.toml::

    [project.entry-points."normbench.norms"]
    maxnorm = "mypkg.norms:MaxNorm"

and ``norm=maxnorm`` (or ``"norm=glob(*)"``) then works in every command: ``install()`` stores a config
for it in Hydra's ConfigStore, ``{name: maxnorm, _target_: mypkg.norms.MaxNorm, <its options>}``,
so the run's config names its class and its hash tells it from any other class of that name. An
entry point that fails to load, or that takes a built-in's name, is left out with one line on stderr.
"""

from __future__ import annotations

import inspect
import sys
from importlib.metadata import entry_points

from hydra.core.config_store import ConfigStore

from normbench.core.configtree import ENTRY_POINT_GROUPS as GROUPS
from normbench.core.errors import ConfigError
from normbench.model.targets import dotted, is_builtin

_installed: dict[str, type | None] = {}  # "group:name" -> its class in this process (None: left out)


def options_of(cls: type) -> dict:
    """A class's options with their defaults: its constructor's keyword-only parameters."""
    params = inspect.signature(cls.__init__).parameters.values()
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY and p.default is not p.empty}


def config_of(kind: str, name: str, cls: type) -> dict:
    """The config group option of a user's class, as its YAML file would hold it."""
    head = {"name": name} if kind == "norm" else {"name": name, "final_norm": True}
    return {**head, "_target_": dotted(cls), **options_of(cls)}


def install(warn=None) -> list[str]:
    """Register every installed package's norms and placements, and their configs; return one line per
    entry point left out. Idempotent: each process calls it before Hydra composes a config."""
    warn = warn or (lambda line: print(line, file=sys.stderr))
    found = {
        kind: [ep for ep in entry_points(group=group) if f"{group}:{ep.name}" not in _installed]
        for kind, group in GROUPS.items()
    }
    if not any(found.values()):
        return []  # no package declares one: PyTorch stays unimported (a sweep's launcher process)
    from normbench.model.norms import NORMS, register_norm
    from normbench.model.placements import PLACEMENTS, register_placement

    registries = {"norm": (NORMS, register_norm), "placement": (PLACEMENTS, register_placement)}
    skipped = []
    for kind, eps in found.items():
        registry, register = registries[kind]
        group = GROUPS[kind]
        for ep in eps:
            key = f"{group}:{ep.name}"
            try:
                cls = ep.load()
                if ep.name in registry and is_builtin(registry[ep.name]):
                    raise ConfigError(f"'{ep.name}' is normbench's own {kind}, which wins")
                register(ep.name)(cls)
                options = config_of(kind, ep.name, cls)
            except Exception as err:  # one bad package must not take the others down
                reason = err if isinstance(err, ConfigError) else f"{type(err).__name__}: {err}"
                line = f"normbench: entry point {group} '{ep.name}' ({ep.value}) is left out: {reason}"
                skipped.append(line)
                warn(line)
                _installed[key] = None  # said once per process
                continue
            ConfigStore.instance().store(group=kind, name=ep.name, node=options)
            _installed[key] = cls
    return skipped

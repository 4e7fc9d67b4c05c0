"""A user's class in a norm or placement config: ``_target_`` (Hydra's convention) imported and checked.

A config like ``{name: maxnorm, _target_: mypkg.norms.MaxNorm, eps: 1e-6}`` says by itself which
class a run trains, so a sweep's workers, a resumed run and a report need nothing but the config.
The class is registered under the config's name, beside normbench's own, which it may not replace.
"""

from __future__ import annotations

import importlib
import sys

from normbench.core.errors import ConfigError


def is_builtin(cls: type) -> bool:
    """Whether a class is one of normbench's own norms or placements."""
    return cls.__module__.startswith("normbench.")


def dotted(cls: type) -> str:
    """The ``_target_`` that names ``cls``."""
    return f"{cls.__module__}.{cls.__qualname__}"


def refuse_builtin_name(registry: dict, kind: str, name: str, cls: type) -> None:
    """A user's class may take any name but one of normbench's own: ``norm=ln`` always means LayerNorm."""
    known = registry.get(name)
    if known is not None and known is not cls and is_builtin(known) and not is_builtin(cls):
        raise ConfigError(
            f"{kind} '{name}' is normbench's own ({dotted(known)}): give {dotted(cls)} another name",
            allowed=[
                f"a {kind} name not in: {', '.join(sorted(n for n, c in registry.items() if is_builtin(c)))}"
            ],
        )


def import_target(target: str, kind: str, name: str) -> type:
    """The class ``target`` names ("pkg.module.Class" or "pkg.module:Class"), or a ConfigError in one line."""
    module_name, _, attr = str(target).replace(":", ".").rpartition(".")
    if not module_name or not attr:
        raise ConfigError(
            f"{kind} '{name}': _target_ '{target}' is not a dotted path to a class",
            allowed=["_target_: mypkg.module.ClassName"],
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        searched = ", ".join(p for p in sys.path if p)
        raise ConfigError(
            f"{kind} '{name}': cannot import {module_name} for _target_ {target} ({err}); "
            f"looked in {searched}",
            allowed=["pip install the package that holds it", "PYTHONPATH=the folder that holds it"],
        ) from None
    except Exception as err:  # the user's module itself fails: say so, not a traceback of normbench
        raise ConfigError(
            f"{kind} '{name}': importing {module_name} for _target_ {target} raised "
            f"{type(err).__name__}: {err}"
        ) from None
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise ConfigError(f"{kind} '{name}': {module_name} has no class {attr} (_target_ {target})")
    return cls

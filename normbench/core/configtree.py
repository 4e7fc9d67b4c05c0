"""Where the Hydra config tree lives and what its groups offer.

Imports nothing heavy (no torch; Hydra only inside ``compose``): ``normbench --help`` lists the groups
from here and must stay fast. ``normbench.training.config`` re-exports both functions.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import yaml

from normbench.core.errors import ConfigError, composition_error

# The entry-point groups through which installed packages add norms and placements
# (normbench.model.extensions registers them).
ENTRY_POINT_GROUPS = {"norm": "normbench.norms", "placement": "normbench.placements"}


def conf_dir() -> Path:
    """The config tree: packaged into the wheel as normbench/conf, or conf/ beside the package in a
    checkout."""
    here = Path(__file__).resolve().parent.parent  # the normbench package
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise RuntimeError(
        f"normbench's config tree is missing (looked in {here / 'conf'} and {here.parent / 'conf'})"
    )


def group_options(group: str) -> list[str]:
    """The names a config group offers (its YAML files), for help texts and errors."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def added_options(group: str, config_dir: Path | None = None) -> list[str]:
    """The options a user adds to ``group``: installed packages' entry points and ``config_dir``'s
    ``GROUP/*.yaml``, less normbench's own."""
    names = (
        {ep.name for ep in entry_points(group=ENTRY_POINT_GROUPS[group])}
        if group in ENTRY_POINT_GROUPS
        else set()
    )
    if config_dir is not None:
        names |= {p.stem for p in (Path(config_dir) / group).glob("*.yaml")}
    return sorted(names - set(group_options(group)))


def default_option(group: str) -> str:
    """The option conf/config.yaml's defaults list chooses for ``group`` (``model`` -> ``mini``)."""
    defaults = yaml.safe_load((conf_dir() / "config.yaml").read_text(encoding="utf-8"))["defaults"]
    for entry in defaults:
        if isinstance(entry, dict) and group in entry:
            return str(entry[group])
    raise KeyError(f"conf/config.yaml chooses no default for '{group}'")


def compose(overrides: list[str]):
    """The config ``normbench train`` would run with these overrides, without a run directory; a mistake
    Hydra finds raises ConfigError in one line. A package's norms and placements are options once
    ``normbench.model.extensions.install()`` has run."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(composition_error(err)) from None

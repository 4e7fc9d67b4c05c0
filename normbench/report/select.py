"""Which runs a report reads: ``--where KEY=VALUE`` and ``--exclude KEY=VALUE`` on their config's dotted keys.

A value is compared as the config's typed value, so ``train.lr=3e-2`` matches a stored 0.03 and
``model.bias=true`` a stored boolean; ``norm`` and ``placement`` are short for ``norm.name`` and
``placement.name``.
"""

from __future__ import annotations

import difflib
import math

import numpy as np
import pandas as pd

from normbench.core.errors import ConfigError
from normbench.report.load import ALIASES, ReportData
from normbench.report.tables import _fmt_value


def same_value(value, text: str) -> bool:
    """Whether a config value (a cell of the runs' table) is the one a user wrote as ``text``."""
    text = text.strip()
    if isinstance(value, (bool, np.bool_)):
        return text.lower() == str(bool(value)).lower()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return text.lower() in ("null", "none")
    if _fmt_value(value) == text:
        return True
    number, target = pd.to_numeric(pd.Series([value, text], dtype=object), errors="coerce")
    return bool(pd.notna(number) and number == target)


def parse_filters(specs: list[str], option: str, keys: list[str]) -> list[tuple[str, str]]:
    """(column, value) for each ``KEY=VALUE``; a key no run's config has is one line naming close keys."""
    allowed = ["norm", "placement", *keys]
    out = []
    for spec in specs:
        name, eq, value = spec.partition("=")
        name = name.strip()
        if not eq or not name:
            raise ConfigError(f"{option} {spec!r}: expected KEY=VALUE, e.g. {option} norm.name=ln")
        column = ALIASES.get(name, name)
        if column not in allowed:
            close = difflib.get_close_matches(name, allowed, n=3, cutoff=0.6)
            hint = (
                f"; close keys: {', '.join(close)}"
                if close
                else "; the keys are those of the runs' config.yaml"
            )
            raise ConfigError(f"{option} {spec}: no run's config has the key {name}{hint}")
        out.append((column, value.strip()))
    return out


def select_runs(d: ReportData, where: list[str], exclude: list[str]) -> str | None:
    """Keep the runs whose config matches every ``where`` and no ``exclude``, in place; the sentence
    that says how many were kept, or None without a filter."""
    if not where and not exclude:
        return None
    wanted = parse_filters(where, "--where", d.config_keys)
    unwanted = parse_filters(exclude, "--exclude", d.config_keys)
    keep = [
        all(same_value(run[k], v) for k, v in wanted) and not any(same_value(run[k], v) for k, v in unwanted)
        for _, run in d.runs.iterrows()
    ]
    shown = " ".join([*(f"--where {k}={v}" for k, v in wanted), *(f"--exclude {k}={v}" for k, v in unwanted)])
    total, kept = len(d.runs), sum(keep)
    if not kept:
        raise ConfigError(f"{shown} keeps none of the {total} runs found")
    renumber = {old: new for new, old in enumerate(i for i, k in enumerate(keep) if k)}
    d.runs = d.runs[keep].reset_index(drop=True)
    for name in ("train", "evals", "grads", "layers", "logits"):
        frame = getattr(d, name)
        frame = frame[frame["run"].isin(renumber)].copy()
        frame["run"] = frame["run"].map(renumber)
        setattr(d, name, frame.reset_index(drop=True))
    return f"The filter ({shown}) kept {kept} of {total} runs."

"""What each configuration ran with beyond the keys it is compared on: its recipe.

Two configurations that differ in their compared key (a placement, a norm) may differ in more: a
placement brings its own initialisation and head tying (Post-LN trains under BERT's init), and a
tuned key takes each configuration's own best value. A comparison read without them credits the
compared key with what the recipe did. ``differences`` names, per configuration, the recipe's
values that are not the same for every configuration, so the report and a claim's verdict say them.
"""

from __future__ import annotations

import pandas as pd

# (config key, the words for it): the parts of a recipe a compared key can bring with it
RECIPE = (("model.init", "init"), ("model.tie_head", "tied head"), ("train.warmup_steps", "warm-up steps"))


def _value(values: pd.Series) -> str:
    """A group's value of one key: 'bert', or 'gpt2/bert' where its runs differ."""
    seen = [
        str(v).lower() if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)
        for v in dict.fromkeys(values.dropna())
    ]
    return "/".join(seen) or "–"


def differences(runs: pd.DataFrame, groups: pd.Series, also: dict | None = None) -> dict[str, str]:
    """{group label: 'init bert, tied head false'} over the RECIPE keys whose value is not the same in
    every group (``groups``: each run's label); ``also``: {label: 'train.lr=0.003'} said first (a tuned
    value). A label whose recipe is the same as every other's, with nothing in ``also``, gets ''."""
    also = also or {}
    said = {label: [also[label]] if also.get(label) else [] for label in dict.fromkeys(groups)}
    for key, words in RECIPE:
        if key not in runs:
            continue
        values = {label: _value(runs.loc[groups.eq(label), key]) for label in said}
        if len(set(values.values())) > 1:
            for label, value in values.items():
                said[label].append(f"{words} {value}")
    return {label: ", ".join(parts) for label, parts in said.items()}

"""Whether a claim's treatment engages at all in its runs: a cap that never binds, or a phenomenon
the baseline never shows, cannot be tested by running the claim, whatever its verdict would read.

A claim names what engages it (``engages`` in its YAML): a summary field of one arm's runs and the
value it must reach in at least one of them, e.g. the attention logits must reach the soft-cap
(``max_attn_logit`` 50 in the uncapped arm) for the cap to change anything, or the baseline's
largest gradient spike must reach twice its running median for a cure of spikes to show. Where no
run of that arm reaches it, the claim reads "not testable at this scale", with the measurement.
"""

from __future__ import annotations

import pandas as pd

from normbench.claims.arms import arm
from normbench.claims.schema import Claim
from normbench.report.load import ReportData


def not_engaged(claim: Claim, d: ReportData) -> str:
    """The measurement showing the treatment never engages in ``d`` ('' where it does, or where the
    claim names nothing that engages it, or no run of its arm reports the field)."""
    spec = claim.engages
    if not spec:
        return ""
    runs = arm(d.runs, claim.a if spec["arm"] == "a" else claim.b)
    field = spec["metric"]
    values = pd.to_numeric(runs[field], errors="coerce").dropna() if field in runs else pd.Series(dtype=float)
    if values.empty or values.max() >= spec["reaches"]:
        return ""
    return (
        f"{spec['why']}: peak {field} {values.max():.3g} < {spec['reaches']:g} in every run of "
        f"{spec['arm']} ({len(values)} runs, from {values.min():.3g})"
    )

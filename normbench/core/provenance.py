"""Provenance: what a result was measured with, and the ``numerics`` version of the code.

A run's ``summary.json`` carries a ``provenance`` block (written by training, read by sweeps,
the report and the claims registry)::

    {"normbench": "0.1.0", "commit": "29939de", "dirty": false,
     "torch": "2.13.0+cpu", "device": "cpu", "device_name": "AMD EPYC ...", "threads": 2,
     "precision": "fp32", "norm_impl": {"rms": "fused-cpu"}, "compile": "off",
     "numerics": 1}

``NUMERICS`` is bumped by any change to the code that alters what an existing config computes
(a schedule, an initialisation, a kernel's arithmetic); its history is the table in docs/runs.md.
A stored result is only the same computation as a new one when their ``numerics`` agree. Runs
stored before results carried provenance count as the oldest version, ``LEGACY_NUMERICS``.
Imports nothing of normbench and no torch, so the sweep planner and the report can use it.
"""

from __future__ import annotations

from collections.abc import Mapping

NUMERICS = 1
LEGACY_NUMERICS = 1


def provenance_of(summary: Mapping) -> dict:
    """The provenance block of a run's summary (empty for a run stored before provenance)."""
    block = summary.get("provenance")
    return dict(block) if isinstance(block, Mapping) else {}


def numerics_of(summary: Mapping) -> int:
    """The ``numerics`` version a stored run was computed with."""
    value = provenance_of(summary).get("numerics", LEGACY_NUMERICS)
    return value if isinstance(value, int) else LEGACY_NUMERICS

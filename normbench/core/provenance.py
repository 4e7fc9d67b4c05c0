"""Provenance: what a result was measured with, and the ``numerics`` version of the code.

A run's ``summary.json`` carries a ``provenance`` block (written by training, read by sweeps,
the report and the claims registry)::

    {"normbench": "0.1.0", "commit": "29939de", "dirty": false,
     "torch": "2.13.0+cpu", "device": "cpu", "device_name": "AMD EPYC ...", "threads": 2,
     "precision": "fp32", "norm_impl": {"rms": "fused-cpu"}, "compile": "off",
     "numerics": 3, "date": "2026-11-26"}

``NUMERICS`` is bumped by any change to the code that alters what an existing config computes
(a schedule, an initialisation, a kernel's arithmetic); its history is the table in docs/runs.md.
A stored result is only the same computation as a new one when their ``numerics`` agree. Runs
stored before results carried provenance count as the oldest version, ``LEGACY_NUMERICS``.

``collect`` writes the block (training and the norm bench); ``norm_impl`` comes from
normbench.model.impls, ``compile`` is "on", "off" or "fell back: <reason>". Results are the same
bit for bit only under the same implementation and thread count (tests/test_train.py checks it).
Imports nothing of normbench and, until ``collect`` runs, no torch, so the sweep planner and the
report can use it.
"""

from __future__ import annotations

import functools
import platform
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

NUMERICS = 3
LEGACY_NUMERICS = 0  # older than every versioned numerics: a run stored before provenance


def provenance_of(summary: Mapping) -> dict:
    """The provenance block of a run's summary (empty for a run stored before provenance)."""
    block = summary.get("provenance")
    return dict(block) if isinstance(block, Mapping) else {}


def numerics_of(summary: Mapping) -> int:
    """The ``numerics`` version a stored run was computed with."""
    value = provenance_of(summary).get("numerics", LEGACY_NUMERICS)
    return value if isinstance(value, int) else LEGACY_NUMERICS


@functools.cache
def git_state() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the normbench checkout this process imported; (None, None) outside git."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    commit = (git("rev-parse", "--short", "HEAD") or "").strip() or None
    if commit is None:
        return None, None
    # the code only (the package, its configs and plugins): results, caches and untracked files are not
    root = Path(__file__).parents[2]
    code = [
        str(Path(__file__).parents[1]),
        *(str(p) for p in (root / "conf", root / "hydra_plugins") if p.is_dir()),
    ]
    changes = git("status", "--porcelain", "--untracked-files=no", "--", *code)
    return commit, None if changes is None else bool(changes.strip())


def git_commit() -> str | None:
    """The commit of the normbench this process imported (None outside a git checkout)."""
    return git_state()[0]


@functools.cache
def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "Hardware")) and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def collect(device, precision: str, norm_impl: Mapping[str, str], compile: str) -> dict:
    """The provenance block of a result measured now on ``device`` (a torch.device), in this process."""
    import torch

    from normbench import __version__

    commit, dirty = git_state()
    return {
        "normbench": __version__,
        "commit": commit,
        "dirty": dirty,
        "torch": torch.__version__,
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "threads": torch.get_num_threads(),
        "precision": precision,
        "norm_impl": dict(norm_impl),
        "compile": compile,
        "numerics": NUMERICS,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),  # UTC: a result's date survives a clone
    }

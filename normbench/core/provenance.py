"""Provenance: what a result was measured with, and the ``numerics`` version of the code.

A run's ``summary.json`` carries a ``provenance`` block, the one place it says what it was measured
with (written by training, read by sweeps, the report and the claims registry)::

    {"normbench": "0.1.0", "commit": "29939de", "dirty": false,
     "torch": "2.13.0+cpu", "python": "3.12.3", "device": "cpu", "device_name": "AMD EPYC ...",
     "threads": 2,
     "precision": "fp32", "norm_impl": {"rms": "fused-cpu"}, "compile": "off",
     "numerics": 3, "date": "2026-11-26"}

``NUMERICS`` is bumped by any change to the code that alters what an existing config computes
(a schedule, an initialisation, a kernel's arithmetic); its history is the table in docs/runs.md.
A stored result is only the same computation as a new one when their ``numerics`` agree. Runs
stored before results carried provenance count as the oldest version, ``LEGACY_NUMERICS``.

``describe`` says what a set of runs was measured with (the report's line, a claim's verdict).
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
from collections.abc import Mapping, Sequence
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


def describe(blocks: Sequence[Mapping], brief: bool = False) -> str:
    """What a set of runs was measured with, from their provenance blocks (one per run; an empty one
    for a run that recorded none): each field's distinct values, a field no run recorded left out.

    The report's sentence: 'Provenance: commit 29939de; torch 2.13.0+cpu; device cpu (AMD EPYC);
    precision fp32; compile off; numerics 3; norm implementations ln=native.', values in the runs'
    order, and how many runs recorded none. ``brief``: a verdict's cell, 'normbench 29939de, torch
    2.13.0+cpu, cpu, ln=native': the commit, torch, the device type and the norms' implementations,
    each field's values sorted and joined by /."""

    def impl(block: Mapping) -> str:
        value = block.get("norm_impl")
        return " ".join(f"{k}={v}" for k, v in sorted(value.items())) if isinstance(value, Mapping) else value

    def commit(block: Mapping) -> str:
        dirty = str(block.get("dirty")) == "True"
        return f"{block['commit']}{('+dirty' if brief else ' (uncommitted changes)') if dirty else ''}"

    def device(block: Mapping) -> str:
        name = block.get("device_name")
        return block["device"] if brief or not name else f"{block['device']} ({name})"

    def values(key: str, show=None) -> str:
        show = show or (lambda block: str(block[key]))
        found = dict.fromkeys(show(b) for b in blocks if b.get(key) is not None and b.get(key) != "")
        return "/".join(sorted(found)) if brief else ", ".join(found)

    if brief:
        impls = sorted({pair for b in blocks for pair in (impl(b) or "").split()})
        parts = [
            f"normbench {values('commit', commit)}" if values("commit") else "",
            f"torch {values('torch')}" if values("torch") else "",
            values("device", device),
            " ".join(impls),
        ]
        return ", ".join(p for p in parts if p)
    fields = {
        "commit": values("commit", commit),
        "torch": values("torch"),
        "device": values("device", device),
        "precision": values("precision"),
        "compile": values("compile"),
        "numerics": values("numerics"),
        "norm implementations": values("norm_impl", impl),
    }
    unrecorded = sum(not b.get("torch") for b in blocks)
    note = f" ({unrecorded} of {len(blocks)} runs recorded none)" if unrecorded else ""
    return "Provenance: " + "; ".join(f"{k} {v}" for k, v in fields.items() if v) + note + "."


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
        "python": platform.python_version(),
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "threads": torch.get_num_threads(),
        "precision": precision,
        "norm_impl": dict(norm_impl),
        "compile": compile,
        "numerics": NUMERICS,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),  # UTC: a result's date survives a clone
    }

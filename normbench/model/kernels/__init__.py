"""normbench's fused CPU kernels (norms_cpu.cpp): built once with the machine's C++ compiler, then cached.

PyTorch has a fused CPU kernel for LayerNorm but not for RMSNorm (its CPU ``rms_norm`` is
five ops forward and five autograd nodes back), ScaleNorm or DyT, and its CPU ``group_norm``
on (tokens, C) takes several times LayerNorm's time (cost: see docs/benchmarks.md#groupnorm), so
on a CPU they cost more than LayerNorm for the same or less math. ``norms_cpu.cpp`` gives each a
forward and a backward in the fewest full-size passes, registered as ``torch.ops.normbench.*``.

``available()`` builds the kernels on first use with ``torch.utils.cpp_extension`` (ninja
and g++: about half a minute, once) into torch's extension cache, under a name that hashes
the source (its text and its path), torch's version and this CPU's instruction set, so later processes (tests,
DDP ranks, sweeps) only load the built library. Where there is no compiler, or
``NORMBENCH_KERNELS=0``, it says so in one line and returns False, and the norms keep
their eager PyTorch path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import sys
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("norms_cpu.cpp")
_state: dict[str, object] = {}


def _cpu_flags() -> str:
    """The CPU's instruction-set flags: a build for -march=native runs only where they match."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def build_name() -> str:
    # The source's path too: ninja's build file names it, so two checkouts sharing one build
    # directory would each find the other's build stale and compile again (half a minute) in turn.
    digest = hashlib.sha256(
        b"\0".join(
            [
                SOURCE.read_bytes(),
                str(SOURCE.resolve()).encode(),
                torch.__version__.encode(),
                _cpu_flags().encode(),
            ]
        )
    ).hexdigest()[:12]
    return f"normbench_cpu_{digest}"


def _missing_tools() -> str | None:
    """Why a build can't start (no compiler, no ninja), or None."""
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler: {compiler} not found"
    if not cpp_extension.is_ninja_available():
        return "ninja not found (pip install ninja)"
    return None


def _load() -> None:
    from torch.utils import cpp_extension

    missing = _missing_tools()
    if missing:
        raise RuntimeError(missing)
    # Torch's own compiler warnings would add lines to the one this module prints on failure.
    log = logging.getLogger("torch.utils.cpp_extension")
    level, log.level = log.level, logging.ERROR
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _build(cpp_extension)
    finally:
        log.setLevel(level)


def _build(cpp_extension) -> None:
    cpp_extension.load(
        name=build_name(),
        sources=[str(SOURCE)],
        # -march=native: this CPU's vector width (the name above pins the build to this CPU);
        # -fopenmp-simd: vectorise the `omp simd` reductions without OpenMP's runtime;
        # -fno-trapping-math: let a division run on lanes whose result is discarded (no FP traps
        # are used), without which no loop holding DyT's tanh is vectorised.
        extra_cflags=["-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math"],
        is_python_module=False,
        verbose=False,
    )


def available() -> bool:
    """True when torch.ops.normbench's CPU kernels are loaded (building them the first time)."""
    if "ok" not in _state:
        _state["ok"] = False
        if os.environ.get("NORMBENCH_KERNELS", "1") == "0":
            _state["why"] = "NORMBENCH_KERNELS=0"
        else:
            try:
                _load()
                _state["ok"] = True
            except Exception as e:  # no compiler, no ninja, a failed build: the eager path still works
                _state["why"] = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        if not _state["ok"]:
            print(
                f"normbench: fused CPU norm kernels unavailable ({_state['why']}); "
                "RMSNorm, ScaleNorm and DyT use eager PyTorch on the CPU (slower)",
                file=sys.stderr,
            )
    return bool(_state["ok"])

"""normbench's fused CPU kernels (norms_cpu.cpp): built once per machine with its C++ compiler, then cached.

PyTorch has a fused CPU kernel for LayerNorm but not for RMSNorm (its CPU ``rms_norm`` is
five ops forward and five autograd nodes back), ScaleNorm or DyT, and its CPU ``group_norm``
on (tokens, C) takes several times LayerNorm's time (cost: see docs/benchmarks.md#groupnorm), so
on a CPU they cost more than LayerNorm for the same or less math. ``norms_cpu.cpp`` gives each a
forward and a backward in the fewest full-size passes, registered as ``torch.ops.normbench.*``.

``available()`` builds the kernels on first use with ``torch.utils.cpp_extension`` (ninja and
the C++ compiler: about half a minute, once, said in one line) and loads them. The build is
cached under a name that hashes what the library depends on: the source's text, the compiler's
version, torch's and Python's versions and this CPU's instruction set; not the source's path.
The source is copied into the build's own directory under that name, and a built library is loaded
as it is, without asking ninja (whose build file names the headers of the virtual environment that
built it): every clone and every virtual environment on a machine shares one build.
``python -m normbench.model.kernels`` builds them ahead (scripts/setup.sh does). Where there is no
compiler, a build fails, or ``NORMBENCH_KERNELS=0``, ``available()`` is False and ``why()`` says why;
normbench.model.impls then runs the eager path and says so once.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
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


def _compiler() -> str:
    return os.environ.get("CXX", "c++")


@functools.cache
def _compiler_version() -> str:
    """The compiler's first line of ``--version``: another compiler (or version), another build."""
    try:
        out = subprocess.run([_compiler(), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return (out.splitlines() or [""])[0]


def build_name() -> str:
    """The build's name: a hash of everything the library depends on (never the source's path)."""
    parts = [
        SOURCE.read_bytes(),
        _compiler_version().encode(),
        torch.__version__.encode(),
        platform.python_version().encode(),
        _cpu_flags().encode(),
    ]
    return "normbench_cpu_" + hashlib.sha256(b"\0".join(parts)).hexdigest()[:12]


def build_dir() -> Path:
    """Where the build lives: torch's extension cache (``TORCH_EXTENSIONS_DIR`` where set), by name."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "torch_extensions"
    )
    return Path(root, "normbench", build_name())


def is_built() -> bool:
    """Whether this machine holds the built library for this source and toolchain (nothing is built)."""
    return (build_dir() / f"{build_name()}.so").is_file()


def will_build() -> bool:
    """Whether ``available()`` would compile now: not yet asked, allowed, a compiler there, nothing built."""
    return (
        "ok" not in _state
        and os.environ.get("NORMBENCH_KERNELS", "1") != "0"
        and _missing_tools() is None
        and not is_built()
    )


def _missing_tools() -> str | None:
    """Why a build can't start (no compiler, no ninja), or None."""
    from torch.utils import cpp_extension

    if shutil.which(_compiler()) is None:
        return f"no C++ compiler: {_compiler()} not found"
    if not cpp_extension.is_ninja_available():
        return "ninja not found (pip install ninja)"
    return None


def _stable_source(directory: Path, name: str) -> Path:
    """The source, copied into the build directory under the build's name: the one path ninja sees."""
    directory.mkdir(parents=True, exist_ok=True)
    copy = directory / f"{name}.cpp"
    text = SOURCE.read_bytes()
    if not copy.is_file() or copy.read_bytes() != text:
        temp = directory / f".{name}.{os.getpid()}.tmp"
        temp.write_bytes(text)
        temp.replace(copy)  # atomic: a process building beside this one never reads half a file
    return copy


def _load() -> None:
    from torch.utils import cpp_extension

    name, directory, builds = build_name(), build_dir(), not is_built()
    if not builds:
        # Loaded as it is: its name already pins what it depends on. Through ninja, a build made from
        # another virtual environment (whose build.ninja names that environment's torch headers) would
        # read as changed and compile again, half a minute unannounced, at every switch between them.
        try:
            torch.ops.load_library(str(directory / f"{name}.so"))
            return
        except OSError:
            pass  # unreadable (a build cut short): ninja below decides, under torch's build lock
    else:
        print("normbench: building the fused CPU norm kernels, once, about 30 s", file=sys.stderr, flush=True)
    started = time.perf_counter()
    # Torch's own compiler warnings would add lines to the one normbench prints on failure.
    log = logging.getLogger("torch.utils.cpp_extension")
    level, log.level = log.level, logging.ERROR
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cpp_extension.load(
                name=name,
                sources=[str(_stable_source(directory, name))],
                # -march=native: this CPU's vector width (the name pins the build to this CPU);
                # -fopenmp-simd: vectorise the `omp simd` reductions without OpenMP's runtime;
                # -fno-trapping-math: let a division run on lanes whose result is discarded (no FP traps
                # are used), without which no loop holding DyT's tanh is vectorised.
                extra_cflags=[
                    "-O3",
                    "-march=native",
                    "-fopenmp-simd",
                    "-fno-math-errno",
                    "-fno-trapping-math",
                ],
                build_directory=str(directory),
                is_python_module=False,
                verbose=False,
            )
    finally:
        log.setLevel(level)
    if builds:
        _state["build_s"] = time.perf_counter() - started


def _first_error(err: Exception) -> str:
    """A failed build's first compiler error line (else the exception's first line)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    errors = [line for line in lines if "error" in line.lower() and not line.startswith("Error building")]
    return (errors or lines)[0][:200]


def available() -> bool:
    """True when torch.ops.normbench's CPU kernels are loaded (building them the first time)."""
    if "ok" not in _state:
        _state["ok"] = False
        if os.environ.get("NORMBENCH_KERNELS", "1") == "0":
            _state["why"] = "NORMBENCH_KERNELS=0"
        elif missing := _missing_tools():
            _state["why"] = missing
        else:
            try:
                _load()
                _state["ok"] = True
            except Exception as e:  # a failed build or load: the eager path still works
                _state["why"] = f"kernel build failed: {_first_error(e)}"
    return bool(_state["ok"])


def why() -> str | None:
    """Why the kernels are not available (None when they are, or have not been asked for)."""
    return _state.get("why")


def build_seconds() -> float | None:
    """How long this process spent building the kernels (None when it built nothing)."""
    return _state.get("build_s")

"""Throughput, step time, peak memory and model FLOPs utilisation (MFU) of a training run.

MFU follows PaLM (Chowdhery et al. 2022, appendix B) as nanoGPT does: model FLOPs per token
= 6 N + 12 L d T (N parameters without position embeddings; the second term is attention),
times tokens per second, over a peak. The peak is ``train.peak_flops`` when given; else, on a
GPU in ``DATASHEET_PEAKS``, its datasheet figure (what MFU is conventionally quoted against);
else the best matrix-multiply rate measured on the device, kept per device, dtype and thread count.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import resource
import statistics
import sys
import time
import weakref
from pathlib import Path

import torch

from normbench.core.fileio import write_atomic


def cache_dir() -> Path:
    return Path(os.environ.get("NORMBENCH_CACHE_DIR", "~/.cache/normbench")).expanduser()


def flops_per_token(model) -> float:
    cfg = model.cfg
    n = model.num_params() - (model.pos_emb.weight.numel() if model.pos_emb is not None else 0)
    return 6 * n + 12 * cfg.n_layer * cfg.d_model * cfg.block_size


def _measure_matmul_flops(
    device: torch.device, dtype: torch.dtype, size: int = 1024, repeats: int = 10
) -> float:
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        sync()
        times.append(time.perf_counter() - start)
    return 2 * size**3 / min(times)


# Dense (no sparsity) peaks from NVIDIA's datasheets, FLOP/s, by torch.cuda.get_device_name.
# "tf32" is the tensor-core rate an fp32 matmul gets when TF32 is allowed, "fp32" the rate without.
_H100_SXM = {"bf16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}
_A100 = {"bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12}
DATASHEET_PEAKS = {
    "NVIDIA H100 80GB HBM3": _H100_SXM,
    "NVIDIA H100 PCIe": {"bf16": 756e12, "tf32": 378e12, "fp32": 51.2e12},
    "NVIDIA H200": _H100_SXM,  # the SXM H200: H100 SXM's compute, more memory
    "NVIDIA A100-SXM4-80GB": _A100,
    "NVIDIA A100-SXM4-40GB": _A100,
    "NVIDIA A100 80GB PCIe": _A100,
    "NVIDIA A100-PCIE-40GB": _A100,
}


def datasheet_peak(device: torch.device, dtype: torch.dtype) -> tuple[float, str] | None:
    """The datasheet peak for this GPU and dtype, with its name; None off a listed GPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if name not in DATASHEET_PEAKS:
        return None
    if dtype in (torch.bfloat16, torch.float16):
        kind = "bf16"
    else:
        kind = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
    return DATASHEET_PEAKS[name][kind], f"datasheet {kind}: {name}"


_MEASURED_HERE: dict[str, float] = {}  # what this process measured, by device, dtype, threads and torch


def peak_flops(device: torch.device, dtype: torch.dtype, setting: float | None = None) -> tuple[float, str]:
    """FLOP/s that count as 100% MFU, and where the figure comes from.

    The setting, else the datasheet peak of a listed GPU, else the best matmul rate ever
    measured here: a peak is a maximum, and a measurement on a busy machine is only a lower
    bound, so each process measures once (a fraction of a second: not again for every run of
    a sweep's worker) and the cache file keeps the highest figure seen.
    """
    if setting:
        return float(setting), "train.peak_flops"
    if (listed := datasheet_peak(device, dtype)) is not None:
        return listed
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    key = f"{name}|{dtype}|{torch.get_num_threads()}|{torch.__version__}"
    path = cache_dir() / "peak_flops.json"
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if key in _MEASURED_HERE:
        return max(cache.get(key, 0.0), _MEASURED_HERE[key]), "measured matmul"
    measured = _MEASURED_HERE[key] = _measure_matmul_flops(
        device, dtype, size=4096 if device.type == "cuda" else 1024
    )
    if measured > cache.get(key, 0.0):
        cache[key] = measured
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(cache, indent=1))
        except OSError:
            pass  # a read-only home only loses the best figure for next time
    return cache[key], "measured matmul"


# /proc/self/clear_refs: writing "5" resets the process's peak resident set (VmHWM in
# /proc/self/status) to its current size (Linux 4.0+), so a run can measure its own peak even
# when a launcher runs several runs in one process (the basic launcher; joblib's reused workers).
_CLEAR_REFS, _STATUS = Path("/proc/self/clear_refs"), Path("/proc/self/status")


def _proc_status_mb(field: str) -> float | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 2**10  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


# The last run's model and optimizer in this process, held weakly (free_earlier_runs).
_earlier_run: list[weakref.ReferenceType] = []


def free_earlier_runs() -> None:
    """Before a run starts, make sure what earlier runs in this process built is freed, so that this
    run's memory figures are its own (PeakMemory). A run's objects go by reference counting as soon
    as it returns (train.py keeps them out of reference cycles); the full collection that finds
    objects in cycles costs a tenth of a second with torch and Hydra loaded
    (docs/benchmarks.md#sweep-efficiency), so it runs only when the last run's model or optimizer
    is still alive (held in a cycle, or by a caller: then nothing frees it anyway).
    """
    if any(ref() is not None for ref in _earlier_run):
        gc.collect()


def remember_run(*objects) -> None:
    """The objects that hold a run's memory, for the next run's free_earlier_runs."""
    _earlier_run[:] = [weakref.ref(obj) for obj in objects]


def _release_freed_memory() -> None:
    """glibc's malloc_trim(0): return the heap's free pages to the OS (a no-op where there is no glibc)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """This run's peak memory, measured from the start of the run, whatever ran before it in the process
    (once ``free_earlier_runs`` has run).

    ``kind`` says what the figure is (summary.json's ``peak_mem_kind``):
    ``cuda_allocated``: the most memory PyTorch's allocator held for tensors on the GPU during the run
    (peak statistics reset when the run starts);
    ``cpu_rss``: the process's peak resident set during the run (the high-water mark reset when the run
    starts: the PyTorch libraries, the data, the model and the activations);
    ``cpu_rss_process``: where the mark cannot be reset (not Linux), the process's peak since it started,
    which includes earlier runs in the same process.
    ``start_mb`` is what was in use when the run started, before its data and model were built (GPU:
    allocated; CPU: resident set).
    """

    def __init__(self, device: torch.device):
        self.device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self.start_mb = torch.cuda.memory_allocated(device) / 2**20
            self.kind = "cuda_allocated"
            return
        # The C allocator keeps what an earlier run freed mapped (the resident set does not shrink),
        # so the high-water mark would start at the earlier run's size: hand it back to the OS first.
        _release_freed_memory()
        try:
            _CLEAR_REFS.write_text("5")
            self.kind = "cpu_rss"
        except OSError:
            self.kind = "cpu_rss_process"
        self.start_mb = _proc_status_mb("VmRSS")  # after the reset, so the peak is never below it

    def peak_mb(self) -> float:
        if self.kind == "cuda_allocated":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        if self.kind == "cpu_rss" and (hwm := _proc_status_mb("VmHWM")) is not None:
            return hwm
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux

    def summary(self) -> dict:
        return {"peak_mem_mb": self.peak_mb(), "peak_mem_kind": self.kind, "peak_mem_start_mb": self.start_mb}


class Phases:
    """Where a run's wall time goes: seconds per phase, summary.json's ``time_s``.

    ``setup`` (data, model, resume), ``steps`` (the updates, statistics hooks included),
    ``statistics`` (turning them into records), ``logging`` (the log windows' one host sync and
    writes), ``eval``, ``checkpoints``, ``probe`` (causality) and ``finish`` (the summary, MFU's
    peak, the final writes).
    """

    def __init__(self, earlier: dict | None = None):
        self.seconds = dict(earlier or {})  # a resumed run's earlier processes count too

    @contextlib.contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start


class StepTimer:
    """Per-step wall times from host timestamps: no device sync of its own.

    On a GPU the host runs ahead until the launch queue fills, after which each
    host step lasts as long as a device step; the steady-state figures exclude warm-up.
    """

    def __init__(self, warmup_steps: int):
        self.warmup = warmup_steps
        self.times: list[float] = []
        self.last = time.perf_counter()

    def tick(self) -> float:
        now = time.perf_counter()
        self.times.append(now - self.last)
        self.last = now
        return self.times[-1]

    def resume(self) -> None:
        """Start the next step's clock now, so time spent evaluating is not counted as a step."""
        self.last = time.perf_counter()

    def steady(self) -> list[float]:
        return self.times[self.warmup :] or self.times

    def summary(self, tokens_per_step: int) -> dict:
        steady = self.steady()
        if not steady:
            return {"tokens_per_s": None, "step_ms_p50": None, "step_ms_p90": None}
        ms = [1000 * t for t in steady]
        median = statistics.median(ms)
        # The 90th percentile, interpolated between order statistics (numpy.percentile's default).
        p90 = statistics.quantiles(ms, n=10, method="inclusive")[-1] if len(ms) > 1 else ms[0]
        return {"tokens_per_s": tokens_per_step / (median / 1000), "step_ms_p50": median, "step_ms_p90": p90}

"""Throughput, step time, peak memory and model FLOPs utilisation (MFU) of a training run.

MFU follows PaLM (Chowdhery et al. 2022, appendix B) as nanoGPT does: model FLOPs per token
= 6 N + 12 L d T (N parameters without position embeddings; the second term is attention),
times tokens per second, over a peak. The peak is ``train.peak_flops`` when given; else, on a
GPU in ``DATASHEET_PEAKS``, its datasheet figure (what MFU is conventionally quoted against);
else the matrix-multiply rate measured on the device, kept per device, precision (TF32 on or
off) and CPU thread count with the date it was measured.
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
from datetime import date
from pathlib import Path

import torch

from normbench.core.devices import device_name, synchronize
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
    for _ in range(3):
        a @ b
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        synchronize(device)
        times.append(time.perf_counter() - start)
    return 2 * size**3 / min(times)


def matmul_kind(device: torch.device, dtype: torch.dtype, tf32: bool) -> str:
    """Which matmul rate a run's precision gets: bf16, fp16, tf32 (an fp32 run with TF32 on a GPU) or
    fp32. TF32 is a CUDA setting (``train.tf32``); the CPU multiplies fp32 as fp32."""
    if dtype in (torch.bfloat16, torch.float16):
        return "bf16" if dtype == torch.bfloat16 else "fp16"
    return "tf32" if tf32 and device.type == "cuda" else "fp32"


# Dense (no sparsity) peaks from NVIDIA's datasheets, FLOP/s, by the name CUDA gives the GPU
# (torch.cuda.get_device_name), with the model's name as the datasheet gives it. "tf32" is the
# tensor-core rate an fp32 matmul gets when TF32 is allowed, "fp32" the rate without; fp16/bf16 are
# the tensor-core rates with fp32 accumulation (PyTorch's). A GPU without a precision in hardware
# (V100: no bf16, no TF32) lists none for it: its fp32 rate stands for TF32, bf16 is measured.
_H100_SXM = {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}
_H100_PCIE = {"bf16": 756.5e12, "fp16": 756.5e12, "tf32": 378e12, "fp32": 51.2e12}
_A100 = {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}
_V100_SXM2 = {"fp16": 125e12, "tf32": 15.7e12, "fp32": 15.7e12}
_V100_PCIE = {"fp16": 112e12, "tf32": 14e12, "fp32": 14e12}
DATASHEET_PEAKS: dict[str, tuple[str, dict[str, float]]] = {
    "NVIDIA H100 80GB HBM3": ("H100 SXM", _H100_SXM),
    "NVIDIA H100 PCIe": ("H100 PCIe", _H100_PCIE),
    "NVIDIA H200": ("H200 SXM", _H100_SXM),  # H100 SXM's compute, more and faster memory
    "NVIDIA A100-SXM4-80GB": ("A100 SXM", _A100),
    "NVIDIA A100-SXM4-40GB": ("A100 SXM", _A100),
    "NVIDIA A100 80GB PCIe": ("A100 PCIe", _A100),
    "NVIDIA A100-PCIE-40GB": ("A100 PCIe", _A100),
    "Tesla V100-SXM2-16GB": ("V100 SXM2", _V100_SXM2),
    "Tesla V100-SXM2-32GB": ("V100 SXM2", _V100_SXM2),
    "Tesla V100-PCIE-16GB": ("V100 PCIe", _V100_PCIE),
    "Tesla V100-PCIE-32GB": ("V100 PCIe", _V100_PCIE),
    "NVIDIA L4": ("L4", {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12}),
    "NVIDIA A10": ("A10", {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12}),
    "NVIDIA L40S": ("L40S", {"bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12}),
    "NVIDIA GeForce RTX 4090": (
        "GeForce RTX 4090",
        {"bf16": 165.2e12, "fp16": 165.2e12, "tf32": 82.6e12, "fp32": 82.6e12},
    ),
}


def datasheet_peak(name: str, kind: str) -> tuple[float, str] | None:
    """The datasheet peak of the GPU CUDA calls ``name`` for a ``matmul_kind``, with its source
    (``datasheet H100 SXM bf16 dense``); None for a GPU or a precision the table does not list."""
    model, peaks = DATASHEET_PEAKS.get(name, (None, {}))
    if kind not in peaks:
        return None
    return peaks[kind], f"datasheet {model} {kind} dense"


PEAK_CACHE = "peak_flops.json"
_MEASURED_HERE: dict[str, dict] = {}  # this process's reading of the cache, by key


def measured_peak(device: torch.device, dtype: torch.dtype, kind: str) -> tuple[float, str]:
    """The matrix-multiply rate measured on this device for ``kind``, and its source (``measured DATE``).

    One figure per device name, kind (TF32 on and off apart) and, on the CPU, thread count, kept
    in the cache file with the date and PyTorch version it was measured with: a sweep's runs reuse
    it, and a measurement under another PyTorch replaces it (a new figure replaces the old one, a
    faster one or not: the figure is what this software gets from this device).
    """
    name = device_name(device)
    threads = f"|{torch.get_num_threads()} threads" if device.type == "cpu" else ""
    key = f"{name}|{kind}{threads}"
    path = cache_dir() / PEAK_CACHE
    entry = _MEASURED_HERE.get(key)
    if entry is None:
        try:
            cache = json.loads(path.read_text())
        except (OSError, ValueError):
            cache = {}
        entry = cache.get(key)
        if not (isinstance(entry, dict) and entry.get("torch") == torch.__version__ and "flops" in entry):
            flops = _measure_matmul_flops(device, dtype, size=4096 if device.type == "cuda" else 1024)
            entry = cache[key] = {
                "flops": flops,
                "date": date.today().isoformat(),
                "torch": torch.__version__,
            }
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, json.dumps(cache, indent=1))
            except OSError:
                pass  # a read-only home: measured again in the next process
        _MEASURED_HERE[key] = entry
    return float(entry["flops"]), f"measured {entry['date']}"


def peak_flops(
    device: torch.device, dtype: torch.dtype, setting: float | None = None, tf32: bool = False
) -> tuple[float, str]:
    """FLOP/s that count as 100% MFU, and where the figure comes from (summary.json's
    ``peak_flops_source``): ``train.peak_flops`` when set, else the datasheet peak of a listed
    GPU (what MFU is conventionally quoted against), else a measured matmul rate (``measured_peak``).
    ``tf32``: an fp32 run's matmuls may use TF32 (``train.tf32``)."""
    if setting:
        return float(setting), "train.peak_flops"
    kind = matmul_kind(device, dtype, tf32)
    if device.type == "cuda" and (listed := datasheet_peak(device_name(device), kind)) is not None:
        return listed
    return measured_peak(device, dtype, kind)


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
    """Per-step wall times, from host timestamps and one device sync per log window.

    A GPU runs the steps the host queued after the host has moved on, so a host timestamp
    says when a step was queued, not when it ran: a window that fits in the launch queue would
    look as fast as the host can queue. ``end_window`` therefore waits for the device
    (``sync``) before it reads the clock, which puts the device's time into the window, and
    gives each of the window's steps the window's mean time (the host's split of it is not the
    device's). The steady-state figures exclude warm-up.
    """

    def __init__(self, warmup_steps: int, sync=lambda: None, clock=time.perf_counter):
        self.warmup = warmup_steps
        self.sync, self.clock = sync, clock
        self.times: list[float] = []
        self.last = clock()

    def tick(self) -> float:
        now = self.clock()
        self.times.append(now - self.last)
        self.last = now
        return self.times[-1]

    def settle(self) -> None:
        """Wait for the device to run the steps ticked so far and count the wait as the last step's
        (before a checkpoint, whose own time is no step's)."""
        self.sync()
        now = self.clock()  # read after the sync: the wait for the device belongs to the steps
        if self.times:
            self.times[-1] += now - self.last
        self.last = now

    def end_window(self, steps: int) -> float:
        """Close a window of the last ``steps`` ticks once the device has run them; its seconds."""
        self.settle()
        seconds = sum(self.times[-steps:])
        self.times[-steps:] = [seconds / steps] * steps
        return seconds

    def resume(self) -> None:
        """Start the next step's clock now, so time spent evaluating is not counted as a step."""
        self.last = self.clock()

    def steady(self) -> list[float]:
        return self.times[self.warmup :] or self.times

    def summary(self, tokens_per_step: int) -> dict:
        """tokens/s and step times over the steady steps; ``timed_steps``: how many steps past warm-up
        (compilation included) they rest on, 0 where the run was too short to have any."""
        steady = self.steady()
        timed = {"timed_steps": len(self.times[self.warmup :])}
        if not steady:
            return {"tokens_per_s": None, "step_ms_p50": None, "step_ms_p90": None, **timed}
        ms = [1000 * t for t in steady]
        median = statistics.median(ms)
        # The 90th percentile, interpolated between order statistics (numpy.percentile's default).
        p90 = statistics.quantiles(ms, n=10, method="inclusive")[-1] if len(ms) > 1 else ms[0]
        return {
            "tokens_per_s": tokens_per_step / (median / 1000),
            "step_ms_p50": median,
            "step_ms_p90": p90,
            **timed,
        }

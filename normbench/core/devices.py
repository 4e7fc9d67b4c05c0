"""Which device and which precision: the one reading of ``device`` and ``precision`` names.

Training (``train.device``, ``train.precision``) and ``normbench bench`` (``--device``,
``--dtype``) both go through here, so they accept the same names and refuse the same way.
"""

from __future__ import annotations

import os

import torch

from normbench.core.errors import ConfigError
from normbench.core.identity import device_type

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str, key: str = "train.device") -> torch.device:
    """'auto' picks CUDA when present; an absent CUDA device is an error, not a silent CPU run.

    ``key`` names the setting in messages; 'auto' is accepted only for train.device.
    """
    auto = key == "train.device"
    names = ["auto", "cpu", "cuda", "cuda:N"] if auto else ["cpu", "cuda", "cuda:N"]
    if name == "auto" and auto:
        return torch.device(device_type(name))  # the device the run's identity reads (its compile state)
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(f"unknown {key} '{name}'", allowed=names) from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index or 0) >= count:
            have = ", ".join(f"cuda:{i}" for i in range(count)) or "no CUDA device"
            raise ConfigError(
                f"{key}={name} is not available (this machine has {have})",
                allowed=["auto", "cpu"] if auto else ["cpu", *(f"cuda:{i}" for i in range(count))],
            )
    elif device.type != "cpu":
        raise ConfigError(f"unsupported {key} '{name}'", allowed=names)
    return device


def synchronize(device: torch.device) -> None:
    """Wait until ``device`` has run everything queued on it (CUDA's kernels are asynchronous; the CPU
    runs in line, so there is nothing to wait for). The device is named: a bare
    ``torch.cuda.synchronize()`` waits on the current device, not necessarily this one."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    """The GPU's name as CUDA reports it (``NVIDIA H100 80GB HBM3``); ``cpu`` off a GPU."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def available_cpus() -> int:
    """The CPUs this process may use (cgroups, taskset, SLURM), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def local_parallel_jobs(launcher: dict | None) -> int | None:
    """How many jobs a launcher runs at once on this machine: joblib's n_jobs (-1 one per CPU,
    -2 all but one, as in joblib), 1 for Hydra's basic launcher, None for launchers whose jobs
    run elsewhere (SLURM, Ray)."""
    launcher = launcher or {}
    n_jobs = launcher.get("n_jobs")
    if isinstance(n_jobs, int) and n_jobs != 0:
        return n_jobs if n_jobs > 0 else max(1, available_cpus() + 1 + n_jobs)
    return 1 if str(launcher.get("_target_", "")).endswith("BasicLauncher") else None

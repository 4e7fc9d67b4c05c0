"""A run's identity (config_hash): train.compile=cuda hashes as what it does on the device the run
trains on, so a compiled and an eager GPU run never share a result, and every CPU run keeps its hash."""

from __future__ import annotations

import pytest
from conftest import compose_cfg, tiny

from normbench.core import identity
from normbench.core.identity import config_hash


def hashes(device: str = "auto", *overrides: str) -> dict[str, str]:
    """The hash of one config at each train.compile."""
    return {
        c: config_hash(compose_cfg(tiny(f"train.device={device}", *overrides, f"train.compile={c}")))
        for c in ("cuda", "false", "auto")
    }


@pytest.fixture
def on(monkeypatch):
    """Where train.device=auto trains: a faked machine with or without CUDA."""

    def machine(kind: str) -> None:
        monkeypatch.setattr(
            identity, "device_type", lambda name: kind if name == "auto" else name.split(":")[0]
        )

    return machine


def test_on_a_gpu_a_compiled_and_an_eager_run_have_two_identities(on):
    on("cuda")
    h = hashes()
    assert h["cuda"] != h["false"]
    assert h["cuda"] == h["auto"]  # cuda on a CUDA device is auto: compiled where it compiles


def test_a_run_naming_a_cuda_device_hashes_as_compiled_wherever_it_is_planned(on):
    on("cpu")  # a plan made on a machine without the GPU names the GPU jobs' directories as they do
    h = hashes("cuda:0")
    assert h["cuda"] != h["false"] and h["cuda"] == h["auto"]


def test_on_the_cpu_compile_cuda_keeps_the_hash_of_compile_false(on):
    on("cpu")
    for device in ("auto", "cpu"):
        h = hashes(device)
        assert h["cuda"] == h["false"] != h["auto"]
    on("cuda")
    h = hashes("cpu")  # a CPU run on a machine with a GPU trains eager too
    assert h["cuda"] == h["false"]


def test_batched_seeds_never_compile_so_cuda_hashes_as_false_on_a_gpu(on):
    on("cuda")
    h = hashes("auto", "train.batched=true")
    assert h["cuda"] == h["false"]


def test_the_machines_auto_device_is_read_from_torch():
    import torch

    assert identity.device_type("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert identity.device_type("cuda:1") == "cuda" and identity.device_type("cpu") == "cpu"

"""The CUDA path on a real GPU: a model's numbers match the CPU's, bf16 autocast keeps the norms'
statistics in fp32, torch.compile matches eager, the step timer waits for the device, and a run
trains on cuda:N in each precision. Every test here needs a GPU and is skipped without one
(scripts/gpu_check.sh runs them: ``-k cuda``)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from conftest import build, compose_cfg, randomize_norms, read_metrics, tiny, train_tiny

from normbench.core.devices import synchronize
from normbench.model.norms import build_norm
from normbench.training.batched import train_batched
from normbench.training.config import parse_config
from normbench.training.loop import train
from normbench.training.perf import DATASHEET_PEAKS, StepTimer

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytestmark = needs_cuda


@pytest.fixture
def full_fp32():
    """fp32 matmuls without TF32 for the comparison, and the setting put back afterwards."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(before)


def forward_backward(model, x, y, call=None):
    """Loss and gradients of ``model``, called directly or through ``call`` (its compiled form)."""
    model.zero_grad(set_to_none=True)
    loss = (model if call is None else call)(x, y)[1]  # a compiled module has no truth value
    loss.backward()
    return loss.detach(), {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None}


def batch(device, vocab=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(vocab, (4, 16), generator=gen)
    return x.to(device), torch.roll(x, -1, dims=1).to(device)


@pytest.mark.parametrize("norm", ["ln", "rms", "bn", "dyt"])
def test_cuda_forward_backward_matches_the_cpu(norm, full_fp32):
    cpu = build("pre", norm).train()
    randomize_norms(cpu)
    gpu = copy.deepcopy(cpu).cuda()
    loss_cpu, grads_cpu = forward_backward(cpu, *batch("cpu"))
    loss_gpu, grads_gpu = forward_backward(gpu, *batch("cuda"))
    assert loss_gpu.item() == pytest.approx(loss_cpu.item(), rel=1e-5)
    assert grads_gpu.keys() == grads_cpu.keys()
    for name, want in grads_cpu.items():
        err = (grads_gpu[name].cpu() - want).abs().max().item()
        assert err <= 1e-4 * max(want.abs().max().item(), 1e-3), (name, err)


@pytest.mark.parametrize("name", ["ln", "rms", "gn"])
def test_cuda_bf16_autocast_keeps_norm_statistics_in_fp32(name):
    """Inputs far from zero: statistics taken in bf16 (E[x^2] - E[x]^2 in 8 bits of mantissa) would be
    off by far more than the output's one rounding to bf16."""
    torch.manual_seed(0)
    norm = build_norm(name, 256).cuda()
    x = (torch.randn(64, 256, device="cuda") * 2 + 60).to(torch.bfloat16)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = norm(x)
    want = copy.deepcopy(norm).double()(x.double())
    err = (out.double() - want).abs().max().item()
    assert err <= 2 * torch.finfo(torch.bfloat16).eps * want.abs().max().item(), err


def test_compiled_model_on_cuda_matches_eager(full_fp32):
    eager = build("pre", "rms").train().cuda()
    twin = copy.deepcopy(eager)
    loss_eager, grads_eager = forward_backward(eager, *batch("cuda"))
    loss_compiled, grads_compiled = forward_backward(twin, *batch("cuda"), call=torch.compile(twin))
    assert loss_compiled.item() == pytest.approx(loss_eager.item(), rel=1e-5)
    assert grads_compiled.keys() == grads_eager.keys()
    for name, want in grads_eager.items():
        err = (grads_compiled[name] - want).abs().max().item()
        assert err <= 1e-4 * max(want.abs().max().item(), 1e-3), (name, err)


def test_cuda_step_timer_counts_the_device_time_of_a_window():
    """The host queues the window's matmuls in microseconds; the window lasts as long as the GPU's work."""
    device = torch.device("cuda", torch.cuda.current_device())
    a = torch.randn(4096, 4096, device=device)
    synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    timer = StepTimer(warmup_steps=0, sync=functools.partial(synchronize, device))
    start.record()
    for _ in range(5):
        for _ in range(10):
            a @ a
        timer.tick()
    end.record()
    window_s = timer.end_window(5)
    device_s = start.elapsed_time(end) / 1000
    assert window_s >= 0.9 * device_s, (window_s, device_s)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_run_trains_on_cuda_in_each_precision(tmp_path, precision):
    index = torch.cuda.device_count() - 1  # a numbered device: every CUDA call must name it
    summary = train_tiny(
        tmp_path, f"train.device=cuda:{index}", f"train.precision={precision}", "train.steps=30"
    )
    assert summary["status"] == "completed", summary["error"]
    assert summary["provenance"]["device"] == "cuda"
    assert summary["peak_mem_kind"] == "cuda_allocated" and summary["peak_mem_mb"] > 0
    evals = [r["val_loss"] for r in read_metrics(tmp_path) if r["kind"] == "eval"]
    assert evals[-1] < evals[0]  # it learned, in every precision
    name = torch.cuda.get_device_name(index)
    if name in DATASHEET_PEAKS and precision != "fp32":
        assert summary["peak_flops_source"].startswith(f"datasheet {DATASHEET_PEAKS[name][0]} {precision}")
    else:
        assert summary["peak_flops_source"].startswith(("datasheet", "measured"))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_batched_seeds_start_and_end_as_their_sequential_runs(tmp_path, full_fp32, precision):
    """Seeds batched on the GPU: each seed's first loss is its sequential run's, each ends near it."""
    overrides = (
        "train.device=cuda",
        "train.steps=60",
        "train.eval_every=30",
        "train.log_every=1",
        f"train.precision={precision}",
    )
    seeds = [0, 1, 2]

    def runs(batched_):
        return [
            parse_config(compose_cfg(tiny(f"seed={s}", f"train.batched={batched_}", *overrides)))
            for s in seeds
        ]

    together = train_batched(runs("true"), [tmp_path / f"b{s}" for s in seeds])
    for s, summary, run in zip(seeds, together, runs("false")):
        alone = train(run, tmp_path / f"s{s}")
        first, want = (
            next(r["train_loss"] for r in read_metrics(tmp_path / f"{side}{s}") if r["kind"] == "train")
            for side in "bs"
        )
        assert first == pytest.approx(want, abs=1e-5 if precision == "fp32" else 1e-3)
        assert summary["provenance"]["batched"] == 3 and summary["provenance"]["device"] == "cuda"
        assert summary["final_val_loss"] == pytest.approx(alone["final_val_loss"], abs=0.02)

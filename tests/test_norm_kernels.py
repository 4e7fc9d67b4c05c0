"""normbench's own norm implementations against the eager math they replace: the fused CPU kernels
(built once, per checkout; their gradients, threads and precisions) and the compiled math on a GPU."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_norms import randomize, reference
from torch import nn

from normbench.model import impls, kernels, norms
from normbench.model.norms import NORMS, build_norm

# --- normbench's fused CPU kernels (normbench/model/kernels) -----------------------------------------

FUSED = ["rms", "gn", "scale", "dyt"]


@pytest.fixture
def fused_kernels():
    """The C++ kernels, built: else skipped with the true reason (no compiler, or the build's first
    error), or failed where NORMBENCH_REQUIRE_KERNELS=1 (CI: a compiler is there, so they must build)."""
    if not kernels.available():
        if os.environ.get("NORMBENCH_REQUIRE_KERNELS") == "1":
            pytest.fail(
                f"NORMBENCH_REQUIRE_KERNELS=1 and the fused CPU kernels are not built: {kernels.why()}"
            )
        pytest.skip(kernels.why())


needs_kernels = pytest.mark.usefixtures("fused_kernels")


def test_the_kernels_build_wherever_a_compiler_is(fused_kernels):
    """With a C++ compiler and ninja present the fused kernels build and load (their ops are registered);
    a skip names the true reason, which NORMBENCH_REQUIRE_KERNELS=1 turns into a failure."""
    assert kernels.why() is None
    for op in ("rms_norm", "group_norm", "scale_norm", "dyt"):
        assert hasattr(torch.ops.normbench, op), op  # looked up: dir() lists only ops already used


def test_the_implementation_table_lists_every_builtin_norm_and_its_fused_kernels():
    """Every built-in norm has its implementations in the one table; the fused CPU ones are the C++ ops."""
    assert set(impls.TABLE) == set(NORMS)
    assert sorted(k for k, i in impls.TABLE.items() if i.fused_cpu) == sorted(FUSED)


def ran_fused(out: torch.Tensor) -> bool:
    """Whether out came from a fused kernel: their autograd nodes are the C++ ones in norms_cpu.cpp."""
    return out.grad_fn is not None and out.grad_fn.name().endswith(
        ("::RMSNormFn>", "::GroupNormFn>", "::ScaleNormFn>", "::DyTFn>")
    )


def forward_backward(norm, x, dy):
    x = x.detach().requires_grad_()
    out = norm(x)
    out.backward(dy)
    grads = [x.grad] + [p.grad for p in norm.parameters()]
    norm.zero_grad(set_to_none=True)
    return out, grads


@needs_kernels
@pytest.mark.parametrize(
    "name, options",
    [("rms", {}), ("gn", {}), ("gn", {"groups": 1}), ("scale", {}), ("dyt", {}), ("dyt", {"bias": False})],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("width", [100, 128])
def test_fused_kernel_matches_the_eager_implementation(name, options, dtype, threads, width, monkeypatch):
    """Output and every gradient of the C++ kernel against normbench's eager PyTorch path, on random
    inputs: an odd token count and a non-contiguous input; a width of 100 (vector loop tails, and
    GroupNorm's groups of 25 and 100 on its scalar loops) and of 128 (GroupNorm's groups of 32 and
    128 on its vector loops); with one thread, and with four (parameter gradients summed over
    unequal chunks of rows)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _fused_matches_eager(name, options, dtype, width, monkeypatch)
    finally:
        torch.set_num_threads(saved)


def _fused_matches_eager(name, options, dtype, width, monkeypatch):
    torch.manual_seed(3)
    norm = randomize(build_norm(name, width, **options)).train()
    x = (torch.randn(width, 7, 3) * 2 + 0.3).to(dtype).transpose(0, 2)  # (3, 7, width), not contiguous
    dy = torch.randn(3, 7, width).to(dtype)
    fused_out, fused_grads = forward_backward(norm, x, dy)
    assert ran_fused(fused_out)  # the kernel ran, not the fallback
    impls.use("eager")
    try:
        norms.implementations(norm, torch.device("cpu"))  # a norm binds by the mode set when it binds
        eager_out, eager_grads = forward_backward(norm, x, dy)
    finally:
        impls.use("auto")
    assert not ran_fused(eager_out)
    # bf16: both round a float32 result once (the eager RMSNorm also rounds its gain to bf16 first).
    tol = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
    assert fused_out.dtype == dtype and fused_out.shape == x.shape
    torch.testing.assert_close(fused_out.float(), eager_out.float(), atol=tol * 4, rtol=tol)
    for fused, eager in zip(fused_grads, eager_grads):
        assert fused.dtype == eager.dtype
        scale = eager.float().abs().max().item()
        torch.testing.assert_close(fused.float(), eager.float(), atol=tol * max(scale, 1.0) * 4, rtol=tol * 4)


@needs_kernels
@pytest.mark.parametrize("name", FUSED)
def test_fused_kernel_gradients_in_float64(name):
    """The kernels' hand-written backward against central differences (float64, the kernel's own path)."""
    torch.manual_seed(4)
    norm = randomize(build_norm(name, 12).double()).train()
    names = [n for n, _ in norm.named_parameters()]
    call = lambda x, *params: torch.func.functional_call(norm, dict(zip(names, params)), (x,))
    x = (torch.randn(5, 12, dtype=torch.float64) * 2 + 0.5).requires_grad_()
    assert ran_fused(call(x, *norm.parameters()))
    assert torch.autograd.gradcheck(call, (x, *norm.parameters()))


@needs_kernels
@pytest.mark.parametrize("name", FUSED)
def test_fused_kernel_under_no_grad_and_inference_mode(name):
    """Evaluation calls the op without autograd (no_grad), or below it (inference_mode: the CPU kernel
    is dispatched directly); both give the training forward's output and record no graph."""
    torch.manual_seed(5)
    norm = randomize(build_norm(name, 48))
    x = torch.randn(6, 48)
    expected = norm(x)
    assert ran_fused(expected)
    with torch.no_grad():
        quiet = norm(x)
    with torch.inference_mode():
        inferred = norm(x)
    assert quiet.grad_fn is None and inferred.grad_fn is None
    torch.testing.assert_close(quiet, expected.detach(), rtol=0, atol=0)
    torch.testing.assert_close(inferred, expected.detach(), rtol=0, atol=0)


@needs_kernels
def test_fused_dyt_tanh_is_accurate_over_its_range():
    """DyT's vectorised tanh against float64 tanh, from 0 through saturation, and NaN stays NaN."""
    norm = build_norm("dyt", 64, alpha_init=1.0)
    x = torch.cat([torch.linspace(-12, 12, 6399), torch.tensor([float("nan")])]).reshape(100, 64)
    out = norm(x)
    expected = torch.tanh(x.double())
    assert out[:-1].isfinite().all() and out.flatten()[-1].isnan()
    err = (out.double() - expected).flatten()[:-1].abs() / expected.flatten()[:-1].abs().clamp_min(1e-30)
    assert err.max().item() < 8 * torch.finfo(torch.float32).eps
    # bf16 (the vectorised path's own loads and stores): tanh of the bf16 input rounded once, NaN kept
    x16 = x.bfloat16()
    out16 = norm(x16)
    assert out16.dtype == torch.bfloat16 and out16.flatten()[-1].isnan()
    rounded = torch.tanh(x16.double()).bfloat16()
    off = (out16.double() - rounded.double()).flatten()[:-1].abs() / rounded.double().flatten()[
        :-1
    ].abs().clamp_min(1e-30)
    assert off.max().item() <= torch.finfo(torch.bfloat16).eps  # at most one bf16 step, and rarely that
    assert (off > 0).float().mean().item() < 0.01


def test_kernel_build_failure_falls_back_with_one_line_naming_every_fused_norm(monkeypatch, capsys):
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setattr(impls, "_said", set())
    build_log = "Error building extension 'x': [1/2] c++ ...\nnorms_cpu.cpp:1:1: error: 'garbage' is no type"
    monkeypatch.setattr(kernels, "_load", lambda: (_ for _ in ()).throw(RuntimeError(build_log)))
    x = torch.randn(4, 16, requires_grad=True)
    out = build_norm("rms", 16)(x)  # the eager path
    build_norm("gn", 16)(x)
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # asked twice, said once
    assert (
        "fused CPU norm kernels unavailable (kernel build failed: norms_cpu.cpp:1:1: error: 'garbage'" in err
    )
    assert "the norms dyt, gn, rms, scale run eager" in err  # GroupNorm too: the table names them
    assert not ran_fused(out)
    assert torch.allclose(out, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), atol=1e-6)


def test_fused_kernels_are_not_traced_by_torch_compile(monkeypatch):
    """Under torch.compile the eager math is traced (inductor fuses it): no custom op in the graph."""
    seen = []
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: seen.append(1) or True)
    x = torch.randn(4, 16, requires_grad=True)
    out = build_norm("dyt", 16)(x)
    assert seen and not ran_fused(out)


@pytest.mark.slow  # a second Python process
def test_another_checkout_of_the_same_source_builds_nothing(tmp_path, fused_kernels):
    """The build is keyed by the source's content and the toolchain, not its path: a copy of the
    package elsewhere (another clone, another venv) loads the build this process made."""
    shutil.copytree(Path(norms.__file__).parents[1], tmp_path / "clone" / "normbench")
    probe = "from normbench.model import kernels; print(kernels.available(), kernels.build_seconds())"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "clone")}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["True", "None"]  # loaded, and nothing built
    assert "building" not in result.stderr


@pytest.mark.slow  # a second Python process
def test_a_build_made_from_another_virtual_environment_loads_without_compiling(tmp_path, fused_kernels):
    """A build's ninja file names the torch headers of the environment that made it; another environment
    with the same torch (a CI clone's, a second venv) loads that build as it is instead of compiling
    it again. The build is copied into a cache of its own, its ninja file pointed at another venv's torch."""
    build = kernels.build_dir()
    cache = tmp_path / "ext" / "normbench" / build.name
    shutil.copytree(build, cache)
    ninja = cache / "build.ninja"
    # whichever environment made the build (this one, or another that shares the cache)
    site = re.search(r"-isystem (\S+)/torch/include", ninja.read_text()).group(1)
    ninja.write_text(ninja.read_text().replace(site, "/elsewhere/.venv/lib/site-packages"))
    library = cache / f"{build.name}.so"
    built = library.stat().st_mtime_ns
    probe = "from normbench.model import kernels; print(kernels.available(), kernels.build_seconds())"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["True", "None"]
    assert library.stat().st_mtime_ns == built  # not compiled again
    assert "/elsewhere/" in ninja.read_text()  # nor asked of ninja


@pytest.mark.slow  # a kernel build (about half a minute) and two CLI trainings
def test_a_runs_kernel_build_is_its_own_phase_and_happens_once(tmp_path, fused_kernels):
    """The first run on a machine builds the kernels before its timed phases (time_s.kernel_build, one
    line saying so); the next run builds nothing."""
    from conftest import run_cli, tiny

    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}  # a machine that has built nothing yet
    times = []
    for run in ("first", "second"):
        args = tiny("norm=rms", "train.steps=2", f"hydra.run.dir={tmp_path / run}")
        result = run_cli("train", *args, env=env, timeout=900)
        assert result.returncode == 0, result.stderr[-2000:]
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        assert summary["provenance"]["norm_impl"] == {"rms": "fused-cpu"}
        times.append((summary["time_s"], result.stderr.count("building the fused CPU norm kernels")))
    (first, said_first), (second, said_second) = times
    assert first["kernel_build"] > 1 and said_first == 1
    assert first["setup"] < first["kernel_build"]  # the build is not in the set-up's time
    assert "kernel_build" not in second and said_second == 0


@pytest.mark.slow  # the CLI in a subprocess
def test_no_compiler_still_trains_with_one_line_saying_so(tmp_path):
    """A user's machine without a C++ compiler: `normbench train norm=rms` works on the eager path."""
    from conftest import run_cli, tiny

    env = {"CXX": str(tmp_path / "no-such-c++"), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    result = run_cli(
        "train", *tiny("norm=rms", "train.steps=4"), f"hydra.run.dir={tmp_path / 'run'}", env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if "fused CPU norm kernels unavailable" in line]
    assert len(lines) == 1 and "no C++ compiler" in lines[0]
    assert (tmp_path / "run" / "summary.json").exists()


@pytest.mark.parametrize(
    "name, math_fn", [("scale", "_scale_norm_math"), ("dyt", "_dyt_math"), ("derf", "_derf_math")]
)
def test_gpu_math_matches_the_norm(name, math_fn, monkeypatch):
    """The plain-op math that torch.compile fuses on a GPU is the norm's math (checked here on the CPU)."""
    torch.manual_seed(5)
    norm = randomize(build_norm(name, 24)).double()
    x = torch.randn(3, 4, 24, dtype=torch.float64)
    params = (
        [norm.weight, 1e-5] if name == "scale" else [p for _, p in norm.named_parameters()]
    )  # dyt: alpha,
    # weight, bias; derf: alpha, shift, weight, bias: the math functions' order
    assert torch.allclose(getattr(norms, math_fn)(x, *params), reference(name, norm, x), atol=1e-12)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
@pytest.mark.parametrize("name", sorted(NORMS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_on_cuda_matches_float64(name, dtype):
    """The CUDA path (PyTorch's fused ops; torch.compile'd math for scale and dyt), fwd and bwd.

    Against the same module in float64 on the CPU, whose gradients are checked against
    finite differences above. Errors are measured against the largest reference value:
    fp32 within 1e-5 of it, bf16 within a few of its ulps (the output rounded once, the
    gradients through a few bf16 roundings of full-size tensors).
    """
    torch.manual_seed(0)
    dim = 256
    cpu = randomize(build_norm(name, dim)).train().double()
    gpu = randomize(build_norm(name, dim)).train().cuda()  # fp32 parameters, as in training
    x = torch.randn(4, 16, dim, dtype=torch.float64) * 2 + 0.5
    dy = torch.randn_like(x)

    def run(module, x, dy):
        x = x.detach().requires_grad_()
        out = module(x)
        out.backward(dy)
        return [out, x.grad, *(p.grad for p in module.parameters())]

    got = run(gpu, x.to("cuda", dtype), dy.to("cuda", dtype))
    want = run(cpu, x, dy)
    assert got[0].dtype == dtype and got[1].dtype == dtype
    ulps = {torch.float32: 1e-5, torch.bfloat16: 4 * torch.finfo(torch.bfloat16).eps}[dtype]
    for what, g, w in zip(["out", "dx", *(n for n, _ in gpu.named_parameters())], got, want):
        err = (g.double().cpu() - w).abs().max().item()
        scale = w.abs().max().item()
        assert err <= ulps * max(scale, 1.0), (
            f"{name} {dtype} {what}: error {err:.3g}, largest value {scale:.3g}"
        )


@needs_cuda
def test_gpu_norms_run_compiled_and_an_out_of_memory_error_propagates():
    """On a GPU, scale, dyt and derf run their torch.compile'd math (said before training); a call that
    runs out of memory raises it, and the norm stays compiled: a call's error never turns the process
    eager."""
    cuda = torch.device("cuda")
    model = nn.ModuleList([build_norm(name, 1024) for name in ("dyt", "scale", "derf", "rms")]).to(cuda)
    assert norms.implementations(model, cuda) == {
        "dyt": "compiled",
        "scale": "compiled",
        "derf": "compiled",
        "rms": "eager",
    }
    dyt = model[0]
    small = torch.randn(8, 1024, device=cuda)
    expected = dyt(small)
    # Room for the input (1 GiB, under 2**31 elements: no recompile for 64-bit indexing) but not its output.
    total = torch.cuda.get_device_properties(cuda).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, (torch.cuda.memory_reserved() + 1.5 * 2**30) / total))
    try:
        big = torch.empty(2**18, 1024, device=cuda)
        with pytest.raises(torch.OutOfMemoryError):
            dyt(big)
        del big
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    assert impls.chosen("dyt", cuda) == "compiled"
    torch.testing.assert_close(dyt(small), expected, rtol=0, atol=0)

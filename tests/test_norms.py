"""Every norm against an independent reference: PyTorch's own modules and hand formulas."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from normbench.core.errors import ConfigError
from normbench.model import impls, kernels, norms
from normbench.model.norms import NORMS, build_norm, norm_options


def randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random gains and biases, so a test can't pass on the init's ones and zeros."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.5 + 1.0)
    return module


def reference(name: str, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The same math from PyTorch's own modules or written out by hand, in float64."""
    x = x.double()
    C = x.shape[-1]
    flat = x.reshape(-1, C)
    p = {k: v.detach().double() for k, v in module.named_parameters()}
    if name == "ln":
        ref = nn.LayerNorm(C, eps=module.eps, bias=module.bias is not None, dtype=torch.float64)
        with torch.no_grad():
            ref.weight.copy_(p["weight"])
            if module.bias is not None:
                ref.bias.copy_(p["bias"])
        return ref(x)
    if name == "rms":
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + module.eps) * p["weight"]
    if name == "gn":
        # nn.GroupNorm on (N, C) rows: one token per row, so no time mixing.
        ref = nn.GroupNorm(module.groups, C, eps=module.eps, dtype=torch.float64)
        with torch.no_grad():
            ref.weight.copy_(p["weight"])
            ref.bias.copy_(p["bias"])
        return ref(flat).reshape(x.shape)
    if name == "bn":
        mean = flat.mean(0)
        var = flat.var(0, unbiased=False)
        return ((x - mean) / torch.sqrt(var + module.bn.eps)) * p["bn.weight"] + p["bn.bias"]
    if name == "scale":
        return p["weight"] * x / x.norm(dim=-1, keepdim=True).clamp_min(module.eps)
    if name == "dyt":
        out = p["weight"] * torch.tanh(p["alpha"] * x)
        return out + p["bias"] if "bias" in p else out
    if name == "derf":
        out = p["weight"] * torch.special.erf(p["alpha"] * x + p["shift"])
        return out + p["bias"] if "bias" in p else out
    if name == "none":
        return x
    raise AssertionError(f"no reference for {name}")


def test_every_registered_norm_has_a_reference_and_a_yaml():
    from normbench.training.config import group_options

    assert sorted(NORMS) == group_options("norm")
    for name in NORMS:
        reference(name, build_norm(name, 8), torch.randn(2, 8))


@pytest.mark.parametrize("name", sorted(NORMS))
@pytest.mark.parametrize("shape", [(4, 16), (2, 5, 16), (3, 2, 4, 16)])
def test_norm_matches_reference(name, shape):
    torch.manual_seed(1)
    norm = randomize(build_norm(name, shape[-1])).train()
    x = torch.randn(shape) * 3 + 1.5
    assert torch.allclose(norm(x).double(), reference(name, norm, x), atol=1e-5, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(sorted(NORMS)),
    lead=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    groups_pow=st.integers(0, 3),
    width_mult=st.integers(2, 6),  # one channel per group is degenerate; tested on its own below
    eps=st.sampled_from([1e-6, 1e-5, 1e-3, 0.1]),
    scale=st.floats(0.01, 100.0),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_norm_property_random_shapes_and_eps(name, lead, groups_pow, width_mult, eps, scale, seed, dtype):
    """Any shape, width, eps, input scale and full-precision dtype; half precision is tested below."""
    groups = 2**groups_pow
    dim = groups * width_mult
    options = {k: v for k, v in {"eps": eps, "groups": groups}.items() if k in norm_options(name)}
    torch.manual_seed(seed)
    norm = randomize(build_norm(name, dim, **options).to(dtype), seed).train()
    x = torch.randn(*lead, dim, dtype=dtype) * scale
    if name == "bn" and math.prod(lead) < 2:
        x = torch.randn(2, dim, dtype=dtype) * scale  # batch statistics need two tokens
    out = norm(x)
    assert out.shape == x.shape and out.dtype == x.dtype
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    assert torch.allclose(out.double(), reference(name, norm, x), atol=tol, rtol=tol)


@pytest.mark.parametrize("name", sorted(NORMS))
def test_norm_gradients_match_finite_differences(name):
    """Gradients for the input and every parameter, against central differences in float64."""
    torch.manual_seed(2)
    norm = randomize(build_norm(name, 8).double()).train()
    names = [n for n, _ in norm.named_parameters()]
    call = lambda x, *params: torch.func.functional_call(norm, dict(zip(names, params)), (x,))
    x = (torch.randn(2, 3, 8, dtype=torch.float64) * 2 + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(call, (x, *norm.parameters()))


def test_scalenorm_gradient_of_a_clamped_token():
    """Below eps the norm is the constant eps: the token is scaled, nothing flows through its norm."""
    gain = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
    x = torch.randn(4, 6, dtype=torch.float64)
    x[1] *= 1e-9  # ||x|| far below eps
    x.requires_grad_()
    norm = build_norm("scale", 6, eps=1e-5).double()
    assert torch.autograd.gradcheck(
        lambda x, g: torch.func.functional_call(norm, {"weight": g}, (x,)), (x, gain)
    )
    dy = torch.randn(4, 6, dtype=torch.float64)
    torch.autograd.backward(norm(x), dy)
    assert torch.allclose(x.grad[1], norm.weight.detach() / 1e-5 * dy[1])


def test_layernorm_worked_example():
    out = build_norm("ln", 4)(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    assert torch.allclose(out, torch.tensor([[-1.3416, -0.4472, 0.4472, 1.3416]]), atol=1e-4)


def test_layernorm_without_bias_has_no_bias_parameter():
    norm = build_norm("ln", 8, bias=False)
    assert [n for n, _ in norm.named_parameters()] == ["weight"]


def test_rmsnorm_does_not_centre():
    """A constant vector is zero after LayerNorm but unit after RMSNorm: no mean subtraction."""
    x = torch.full((1, 8), 3.0)
    assert torch.allclose(build_norm("ln", 8)(x), torch.zeros(1, 8), atol=1e-6)
    assert torch.allclose(build_norm("rms", 8)(x), torch.ones(1, 8), atol=1e-5)
    assert [n for n, _ in build_norm("rms", 8).named_parameters()] == ["weight"]


def test_groupnorm_with_one_group_is_layernorm_and_one_per_group_is_bias():
    x = torch.randn(3, 7, 12)
    assert torch.allclose(build_norm("gn", 12, groups=1)(x), F.layer_norm(x, (12,)), atol=1e-5)
    gn = randomize(build_norm("gn", 12, groups=12))
    # x - mean is float rounding (~1e-7) divided by sqrt(eps): tiny, not exactly zero.
    assert torch.allclose(gn(x), gn.bias.expand_as(x), atol=1e-3)  # zero variance per group


def test_groupnorm_is_per_token_never_across_time():
    """The trap: nn.GroupNorm on (B, C, T) pools time steps; ours must not."""
    gn = build_norm("gn", 8, groups=2)
    x = torch.randn(2, 6, 8)
    future_changed = x.clone()
    future_changed[:, 3:] += torch.randn(2, 3, 8) * 10
    assert torch.equal(gn(x)[:, :3], gn(future_changed)[:, :3])
    # ...whereas the channels-second layout mixes time, which is why we don't use it.
    trap = nn.GroupNorm(2, 8)
    leaky = lambda t: trap(t.transpose(1, 2)).transpose(1, 2)
    assert not torch.allclose(leaky(x)[:, :3], leaky(future_changed)[:, :3])


def test_batchnorm_pools_over_batch_and_time_in_training():
    bn = build_norm("bn", 4).train()
    x = torch.randn(3, 5, 4) * 2 + 7
    out = bn(x)
    flat = out.reshape(-1, 4)
    assert torch.allclose(flat.mean(0), torch.zeros(4), atol=1e-5)
    assert torch.allclose(flat.var(0, unbiased=False), torch.ones(4), atol=1e-3)
    # PyTorch's own BatchNorm1d on the flattened tokens agrees exactly.
    ref = nn.BatchNorm1d(4)
    assert torch.allclose(out, ref(x.reshape(-1, 4)).reshape(x.shape), atol=1e-6)


def test_batchnorm_uses_running_statistics_in_eval():
    bn = build_norm("bn", 4, momentum=0.5).train()
    x = torch.randn(8, 4) * 3 + 2
    bn(x)
    # momentum 0.5 from (0, 1): running = 0.5 * init + 0.5 * batch (unbiased variance, as PyTorch does).
    assert torch.allclose(bn.bn.running_mean, 0.5 * x.mean(0), atol=1e-6)
    assert torch.allclose(bn.bn.running_var, 0.5 + 0.5 * x.var(0, unbiased=True), atol=1e-5)
    bn.eval()
    y = torch.randn(2, 3, 4)
    expected = (y - bn.bn.running_mean) / torch.sqrt(bn.bn.running_var + bn.bn.eps)
    assert torch.allclose(bn(y), expected, atol=1e-5)
    # Eval mode is per token: the first token's output ignores everything else in the batch.
    assert torch.allclose(bn(y[:1, :1]), bn(y)[:1, :1], atol=1e-6)


def test_scalenorm_gain_starts_at_sqrt_d():
    norm = build_norm("scale", 64)
    assert norm.weight.shape == () and math.isclose(norm.weight.item(), 8.0)
    x = torch.randn(5, 64)
    assert torch.allclose(norm(x).norm(dim=-1), torch.full((5,), 8.0), atol=1e-4)


def test_dyt_alpha_init_and_shape():
    norm = build_norm("dyt", 8, alpha_init=0.25)
    assert norm.alpha.shape == () and norm.alpha.item() == 0.25
    x = torch.randn(3, 8)
    assert torch.allclose(norm(x), torch.tanh(0.25 * x), atol=1e-6)


def test_derf_by_hand_and_its_gradients():
    """y = gamma * erf(alpha x + s) + beta: alpha0 = 0.5, s0 = 0, gamma ones, beta zeros; then random
    values against torch.special.erf written out, and every gradient against finite differences."""
    norm = build_norm("derf", 6)
    assert (
        norm.alpha.shape == norm.shift.shape == () and norm.alpha.item() == 0.5 and norm.shift.item() == 0.0
    )
    assert torch.equal(norm.weight, torch.ones(6)) and torch.equal(norm.bias, torch.zeros(6))
    assert norm.statistics is None and build_norm("derf", 6, alpha_init=0.3).alpha.item() == pytest.approx(
        0.3
    )
    assert build_norm("derf", 6, bias=False).bias is None
    x = torch.tensor([[-3.0, -1.0, 0.0, 0.5, 2.0, 10.0]])
    assert torch.allclose(norm(x), torch.special.erf(0.5 * x), atol=1e-7)
    norm = build_norm("derf", 6).double()
    with torch.no_grad():
        norm.alpha.fill_(0.7), norm.shift.fill_(-0.2)
        norm.weight.copy_(torch.linspace(0.5, 2.0, 6, dtype=torch.float64))
        norm.bias.copy_(torch.linspace(-1.0, 1.0, 6, dtype=torch.float64))
    x = x.double()
    by_hand = [
        [norm.weight[j].item() * math.erf(0.7 * x[0, j].item() - 0.2) + norm.bias[j].item() for j in range(6)]
    ]
    assert torch.allclose(norm(x), torch.tensor(by_hand, dtype=torch.float64), atol=1e-12)
    names = [n for n, _ in norm.named_parameters()]
    assert names == ["alpha", "shift", "weight", "bias"]
    call = lambda x, *params: torch.func.functional_call(norm, dict(zip(names, params)), (x,))
    x = (torch.randn(2, 3, 6, dtype=torch.float64) * 2).requires_grad_()
    params = [p.detach().clone().requires_grad_() for p in norm.parameters()]
    assert torch.autograd.gradcheck(call, (x, *params))


@pytest.mark.parametrize("name", sorted(NORMS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_statistics_in_float32(name, dtype):
    """Output in the input's dtype, as accurate as rounding a float64 result to that dtype.

    The input has a large common offset: computing the mean or variance in bf16 would
    lose the signal entirely, so only float32 statistics pass.
    """
    torch.manual_seed(0)
    dim = 256
    norm = randomize(build_norm(name, dim)).train()
    x = (torch.randn(4, 8, dim) + (40.0 if name not in ("dyt", "derf", "scale") else 0.0)).to(dtype)
    out = norm(x)
    assert out.dtype == dtype
    expected = reference(name, norm, x.double())
    err = (out.double() - expected).abs().max().item()
    ulp = torch.finfo(dtype).eps * max(1.0, expected.abs().max().item())
    # Measured: at most 0.61 ulp here; the same LayerNorm computed in bf16 is off by 3.9 ulp.
    assert err <= ulp, f"{name} {dtype}: error {err:.3g} vs one ulp {ulp:.3g}"


def test_bad_norm_name_and_options_are_clear():
    with pytest.raises(
        ConfigError, match="unknown norm 'foo'; allowed: bn, derf, dyt, gn, ln, none, rms, scale"
    ):
        build_norm("foo", 8)
    with pytest.raises(ConfigError, match="norm 'rms' has no option bias; allowed: norm.eps"):
        build_norm("rms", 8, bias=False)
    with pytest.raises(ConfigError, match="must divide the model width 10"):
        build_norm("gn", 10, groups=4)
    with pytest.raises(ConfigError, match="eps must be > 0"):
        build_norm("ln", 8, eps=0.0)


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
    assert {"rms_norm", "group_norm", "scale_norm", "dyt"} <= set(dir(torch.ops.normbench))


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


def test_layer_and_group_norm_params_follow_x_off_the_cpu():
    """CUDA's layer_norm and group_norm want gains in x's dtype; the CPU's take float32 ones as they
    are. A meta tensor stands in for a GPU one (neither is on the CPU)."""
    w, b = torch.ones(8), torch.zeros(8)
    on_cpu = norms._params_for(torch.empty(2, 8, dtype=torch.bfloat16), w, b)
    assert on_cpu[0] is w and on_cpu[1] is b
    elsewhere = norms._params_for(torch.empty(2, 8, dtype=torch.bfloat16, device="meta"), w, None)
    assert elsewhere[0].dtype == torch.bfloat16 and elsewhere[1] is None
    assert norms._params_for(torch.empty(2, 8, device="meta"), w, b)[0] is w  # same dtype: untouched


def test_dyt_alpha_init_per_position_reaches_each_norm_and_defaults_to_alpha_init():
    """The DyT paper's LLaMA recipe: alpha0 per position (before attention, before the MLP, the final
    norm)."""
    from normbench.model.gpt import GPT
    from normbench.training.config import load_group

    cfg = load_group("model", "micro", arch="llama")
    per_position = {"alpha_init_attn": 0.8, "alpha_init_mlp": 0.2, "alpha_init_final": 0.3}
    for placement in ("pre", "peri", "post"):
        model = GPT(cfg, 16, {"name": "dyt", "alpha_init": 0.5, **per_position}, {"name": placement})
        for block in model.blocks:
            for name, norm in block.named_children():
                if name.startswith("norm"):
                    assert norm.alpha.item() == pytest.approx(0.8 if "attn" in name else 0.2), (
                        placement,
                        name,
                    )
        assert model.norm_final.alpha.item() == pytest.approx(0.3)
    # Unset (null, the YAML's default): every norm starts at alpha_init, the model of before bit for bit.
    torch.manual_seed(0)
    old = GPT(cfg, 16, {"name": "dyt", "alpha_init": 0.7}, {"name": "pre"})
    torch.manual_seed(0)
    new = GPT(cfg, 16, {"name": "dyt", "alpha_init": 0.7, **dict.fromkeys(per_position)}, {"name": "pre"})
    assert all(torch.equal(a, b) for a, b in zip(old.state_dict().values(), new.state_dict().values()))
    assert [n.alpha.item() for n in new.modules() if hasattr(n, "alpha")] == [pytest.approx(0.7)] * 5
    with pytest.raises(ConfigError, match="norm 'ln' has no option alpha_init_attn"):
        build_norm("ln", 8, alpha_init_attn=0.8)


@pytest.mark.parametrize("name", ["ln", "rms", "gn", "dyt"])
def test_a_norm_moved_to_another_device_binds_that_devices_implementation(name):
    """A norm binds its implementation once, for where it is, and again after a move: on the meta
    device (no kernels there) it runs the eager math, and its output lives there."""
    norm = build_norm(name, 8)
    assert norm.impl_name == impls.chosen(name, torch.device("cpu"))
    norm.to("meta")
    out = norm(torch.randn(2, 3, 8, device="meta"))
    assert out.device.type == "meta" and out.shape == (2, 3, 8)
    assert norm.impl_name == impls.EAGER and norm.device.type == "meta"

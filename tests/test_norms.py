"""Every norm against an independent reference: PyTorch's own modules and hand formulas."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from normbench.core.errors import ConfigError
from normbench.model import impls, norms
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

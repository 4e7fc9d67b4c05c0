"""The model's initialisation, parameter by parameter, its FLOPs against PyTorch's own counter, and QK-norm."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from normbench.config import parse_config
from normbench.diagnostics import attention_logits
from normbench.config import load_group
from normbench.model import GPT, qk_norms
from normbench.perf import flops_per_token
from normbench.train import Run

from conftest import SMALL_MODEL as CFG, build, compose_cfg, randomize_norms, tiny

N_LAYER, D, VOCAB = 2, 128, 64


def intended_std(name: str, shape: torch.Size, init: str, placement: str) -> float | None:
    """The std each weight matrix should start with, written out from the papers; None for the rest.

    gpt2: N(0, 0.02), the residual output projections 0.02 / sqrt(2 n_layer) (GPT-2).
    xavier: Xavier-uniform, std sqrt(2 / (fan_in + fan_out)), embeddings N(0, 0.02) (Xiong et al. 2020).
    deepnorm: Xavier-normal on top, gain beta = (8N)^(-1/4) on value, output and FFN, 1 on query/key (DeepNet).
    """
    if name in ("tok_emb.weight", "pos_emb.weight"):  # tok_emb.weight is also the head's
        return 0.02
    if len(shape) != 2:
        return None
    fan_out, fan_in = shape
    if placement == "deepnorm":
        if name.endswith("attn.qkv.weight"):  # q, k (gain 1) and v (gain beta): checked block by block
            return None
        return (8 * N_LAYER) ** -0.25 * math.sqrt(2.0 / (fan_in + fan_out))
    if init == "xavier":
        return math.sqrt(2.0 / (fan_in + fan_out))
    residual = name.endswith(("attn.proj.weight", "mlp.proj.weight"))
    return 0.02 / math.sqrt(2 * N_LAYER) if residual else 0.02


@pytest.mark.parametrize("init, placement", [("gpt2", "pre"), ("xavier", "pre"), ("gpt2", "deepnorm"), ("xavier", "deepnorm")])
def test_every_parameter_starts_with_its_intended_std(init, placement):
    torch.manual_seed(0)
    model = GPT(load_group("model", n_layer=N_LAYER, n_head=4, d_model=D, block_size=32, init=init), VOCAB,
                {"name": "ln"}, {"name": placement, "final_norm": placement != "deepnorm"})
    assert model.head.weight is model.tok_emb.weight
    checked = 0
    for name, p in model.named_parameters():
        expected = intended_std(name, p.shape, init, placement)
        if name.endswith(".bias"):
            assert torch.all(p == 0), name
        elif "norm" in name:  # LayerNorm gains start at one, untouched by the model's init
            assert torch.all(p == 1), name
        elif expected is not None:
            # Thousands of entries each: the sample std is within a few percent of the true one.
            assert p.std().item() == pytest.approx(expected, rel=0.05), (name, p.std().item(), expected)
            assert abs(p.mean().item()) < 0.1 * expected, name
            checked += 1
    if placement == "deepnorm":
        q, k, v = model.blocks[0].attn.qkv.weight.split(D)
        beta = (8 * N_LAYER) ** -0.25
        for part, gain in ((q, 1.0), (k, 1.0), (v, beta)):
            assert part.std().item() == pytest.approx(gain * math.sqrt(2.0 / (2 * D)), rel=0.05)
    assert checked >= 2 + 3 * N_LAYER  # the embeddings and every block's matrices


def test_gpt2_init_scales_residual_projections():
    torch.manual_seed(0)
    model = GPT(load_group("model", n_layer=8, d_model=256, n_head=4, block_size=8), 50, {"name": "ln"}, {"name": "pre"})
    assert model.blocks[0].mlp.fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks[0].mlp.proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert model.head.weight is model.tok_emb.weight


def test_xavier_init_option(tmp_path):
    torch.manual_seed(0)
    state = Run(parse_config(compose_cfg(tiny("model.init=xavier", "model.d_model=64", "model.n_layer=4"))), tmp_path)
    fc = state.model.blocks[0].mlp.fc.weight
    proj = state.model.blocks[0].mlp.proj.weight
    assert fc.abs().max().item() <= math.sqrt(6 / (64 + 256)) + 1e-6
    assert proj.std().item() == pytest.approx(math.sqrt(2 / (64 + 256)), rel=0.05)  # no residual scaling


def test_flops_per_token_against_torch_flop_counter():
    """6N + 12 L d T against the matmul FLOPs PyTorch counts in one forward and backward pass.

    The attention term is compared exactly: through SDPA's math backend (FlopCounterMode does not
    count the CPU flash kernel) attention is two batched matmuls of full T x T products (QK^T and
    AV: 4 T^2 d per layer forward, twice that backward), the causal mask's skipped half included,
    as the PaLM formula counts it, so the expected ratio of counted to formula is 1. The 6N term
    counts every parameter; the counter sees only the matrices (the head's included), so its
    total is lower by exactly 6 x (biases and norm gains) per token, 1.6% here.
    """
    torch.manual_seed(0)
    cfg = load_group("model", n_layer=3, n_head=4, d_model=64, block_size=32)
    model = GPT(cfg, VOCAB, {"name": "ln"}, {"name": "pre"})
    batch = 4
    idx = torch.randint(VOCAB, (batch, cfg.block_size))
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        _, loss = model(idx, idx)
        loss.backward()
    tokens = batch * cfg.block_size
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    assert set(by_op) == {"aten.mm", "aten.addmm", "aten.bmm"}, by_op  # the linears, and attention's bmm
    attention = by_op["aten.bmm"]
    matmuls = by_op["aten.mm"] + by_op["aten.addmm"]
    assert attention / tokens == pytest.approx(12 * cfg.n_layer * cfg.d_model * cfg.block_size, rel=1e-9)
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2) - model.pos_emb.weight.numel()
    assert matmuls / tokens == pytest.approx(6 * matrices, rel=1e-9)
    vectors = sum(p.numel() for p in model.parameters() if p.dim() < 2)
    assert flops_per_token(model) == pytest.approx(counter.get_total_flops() / tokens + 6 * vectors, rel=1e-9)
    assert counter.get_total_flops() / tokens / flops_per_token(model) == pytest.approx(1.0, abs=0.02)


# ---------------------------------------------------------------- QK-norm


def test_qk_norm_choices_are_the_per_vector_norms():
    assert qk_norms() == ["gn", "ln", "rms", "scale"]


@pytest.mark.parametrize("qk_norm", ["rms", "ln"])
def test_qk_norm_normalizes_each_head_over_head_dim(qk_norm):
    """Per head and token, q and k divided by their gain have RMS 1 (and mean 0 for LayerNorm)."""
    model = build("pre", qk_norm=qk_norm)
    randomize_norms(model)
    attn = model.blocks[1].attn
    head_dim = CFG.d_model // CFG.n_head
    assert attn.q_norm.weight.shape == (head_dim,), "one gain vector shared by all heads"
    assert getattr(attn.q_norm, "bias", None) is None, "QK-norm has no bias"
    x = torch.randn(3, 8, CFG.d_model) * 5
    q, k, _ = attn.heads(x)
    for t, norm in ((q, attn.q_norm), (k, attn.k_norm)):
        unscaled = t / norm.weight
        assert torch.allclose(unscaled.pow(2).mean(-1) if qk_norm == "rms" else unscaled.var(-1, unbiased=False),
                              torch.ones(3, CFG.n_head, 8), atol=1e-3)
        if qk_norm == "ln":
            assert torch.allclose(unscaled.mean(-1), torch.zeros(3, CFG.n_head, 8), atol=1e-4)


@pytest.mark.parametrize("qk_norm", ["rms", "ln"])
def test_qk_norm_bounds_the_attention_logit(qk_norm):
    """|q·k| / sqrt(d) <= ||q|| ||k|| / sqrt(d) <= sqrt(d) max|g_q| max|g_k|, however large the weights."""
    head_dim = CFG.d_model // CFG.n_head
    x = torch.randn(2, 16, CFG.d_model)
    largest = {}
    for which in ("none", qk_norm):
        model = build("pre", qk_norm=which)
        randomize_norms(model)
        attn = model.blocks[0].attn
        with torch.no_grad():
            attn.qkv.weight.mul_(100)
            q, k, _ = attn.heads(x)
        largest[which] = float(attention_logits(q, k).max())
        if which != "none":
            bound = math.sqrt(head_dim) * float(attn.q_norm.weight.detach().abs().max() * attn.k_norm.weight.detach().abs().max())
    assert largest[qk_norm] <= bound * (1 + 1e-5)
    assert largest["none"] > 10 * bound, "without QK-norm the same weights must break the bound"


def test_qk_norm_and_placement_options_are_checked():
    from normbench.errors import ConfigError

    with pytest.raises(ConfigError, match="model.qk_norm=bn cannot normalize queries and keys.*allowed: none, gn, ln, rms, scale"):
        load_group("model", qk_norm="bn").validate()
    with pytest.raises(ConfigError, match="model.qk_norm=dyt cannot"):
        load_group("model", qk_norm="dyt").validate()
    with pytest.raises(ConfigError, match="unknown model.qk_norm 'foo'"):
        load_group("model", qk_norm="foo").validate()

"""The model's initialisation, parameter by parameter, its FLOPs against PyTorch's own counter, and
QK-norm."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import SMALL_MODEL as CFG
from conftest import build, compose_cfg, randomize_norms, tiny
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from normbench.core.errors import ConfigError
from normbench.model.causality import causal_leak
from normbench.model.gpt import GPT, qk_norms
from normbench.model.norms import NORMS
from normbench.model.placements import PLACEMENTS
from normbench.training.config import load_group, parse_config
from normbench.training.diagnostics import attention_logits
from normbench.training.loop import Run
from normbench.training.perf import flops_per_token
from normbench.training.summary import LEAK_TOLERANCE

N_LAYER, D, VOCAB = 2, 128, 64


def intended_std(name: str, shape: torch.Size, init: str, placement: str) -> float | None:
    """The std each weight matrix should start with, written out from the papers; None for the rest.

    gpt2: N(0, 0.02), the residual output projections 0.02 / sqrt(2 n_layer) (GPT-2).
    xavier: Xavier-uniform, std sqrt(2 / (fan_in + fan_out)), embeddings N(0, 0.02) (Xiong et al. 2020).
    deepnorm: Xavier-normal on top, gain beta = (8N)^(-1/4) on value, output and FFN, 1 on query/key
    (DeepNet).
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


@pytest.mark.parametrize(
    "init, placement", [("gpt2", "pre"), ("xavier", "pre"), ("gpt2", "deepnorm"), ("xavier", "deepnorm")]
)
def test_every_parameter_starts_with_its_intended_std(init, placement):
    torch.manual_seed(0)
    model = GPT(
        load_group("model", n_layer=N_LAYER, n_head=4, d_model=D, block_size=32, init=init),
        VOCAB,
        {"name": "ln"},
        {"name": placement, "final_norm": placement != "deepnorm"},
    )
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
    model = GPT(
        load_group("model", n_layer=8, d_model=256, n_head=4, block_size=8),
        50,
        {"name": "ln"},
        {"name": "pre"},
    )
    assert model.blocks[0].mlp.fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks[0].mlp.proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert model.head.weight is model.tok_emb.weight


def test_xavier_init_option(tmp_path):
    torch.manual_seed(0)
    state = Run(
        parse_config(compose_cfg(tiny("model.init=xavier", "model.d_model=64", "model.n_layer=4"))), tmp_path
    )
    fc = state.model.blocks[0].mlp.fc.weight
    proj = state.model.blocks[0].mlp.proj.weight
    assert fc.abs().max().item() <= math.sqrt(6 / (64 + 256)) + 1e-6
    assert proj.std().item() == pytest.approx(math.sqrt(2 / (64 + 256)), rel=0.05)  # no residual scaling


def test_llama_init_starts_embeddings_at_unit_scale_and_an_untied_head_at_one_over_sqrt_width():
    """torchtitan's LLaMA: token embeddings N(0, 1), linears GPT-2's (residual projections
    0.02 / sqrt(2 n_layer)), an untied head N(0, 1 / d_model); a head tied to unit-scale embeddings is
    refused in one line."""
    torch.manual_seed(0)
    cfg = load_group(
        "model", n_layer=4, n_head=4, d_model=D, block_size=32, arch="llama", init="llama", tie_head=False
    )
    model = GPT(cfg, VOCAB, {"name": "dyt"}, {"name": "pre"})
    assert model.head.weight is not model.tok_emb.weight
    assert model.tok_emb.weight.std().item() == pytest.approx(1.0, rel=0.05)
    assert model.head.weight.std().item() == pytest.approx(D**-0.5, rel=0.05)
    assert model.blocks[0].mlp.proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.05)
    assert model.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    # what the first block's DyT (alpha 0.5) hands attention: unit-scale under llama, 0.01 under gpt2
    x = model.tok_emb(torch.arange(VOCAB))
    assert model.blocks[0].norm_attn(x).std().item() > 0.3
    cfg.tie_head = True
    with pytest.raises(ConfigError, match="model.init=llama .* allowed: model.tie_head=false"):
        cfg.validate()


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
        assert torch.allclose(
            unscaled.pow(2).mean(-1) if qk_norm == "rms" else unscaled.var(-1, unbiased=False),
            torch.ones(3, CFG.n_head, 8),
            atol=1e-3,
        )
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
            bound = math.sqrt(head_dim) * float(
                attn.q_norm.weight.detach().abs().max() * attn.k_norm.weight.detach().abs().max()
            )
    assert largest[qk_norm] <= bound * (1 + 1e-5)
    assert largest["none"] > 10 * bound, "without QK-norm the same weights must break the bound"


def test_qk_norm_and_placement_options_are_checked():
    from normbench.core.errors import ConfigError

    with pytest.raises(
        ConfigError,
        match="model.qk_norm=bn cannot normalize queries and keys.*allowed: none, gn, ln, rms, scale",
    ):
        load_group("model", qk_norm="bn").validate()
    with pytest.raises(ConfigError, match="model.qk_norm=dyt cannot"):
        load_group("model", qk_norm="dyt").validate()
    with pytest.raises(ConfigError, match="unknown model.qk_norm 'foo'"):
        load_group("model", qk_norm="foo").validate()


# ----------------------------------------------------- model.arch=llama: rotary embeddings, SwiGLU, no biases


def llama(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(
        load_group("model", "micro", arch="llama", **overrides), VOCAB, {"name": "rms"}, {"name": "pre"}
    )


def rope_by_hand(x: torch.Tensor, m: float, base: float = 10000.0) -> torch.Tensor:
    """x (head_dim,) at position m: channel i paired with i + d/2, the pair rotated by m * base^(-2i/d)."""
    d = x.shape[-1]
    out = torch.empty_like(x)
    for i in range(d // 2):
        theta = m * base ** (-2 * i / d)
        a, b = x[i], x[i + d // 2]
        out[i] = a * math.cos(theta) - b * math.sin(theta)
        out[i + d // 2] = a * math.sin(theta) + b * math.cos(theta)
    return out


def test_rotary_matches_the_hand_rotation():
    from normbench.model.layers import Rotary

    torch.manual_seed(0)
    x = torch.randn(7, 16, dtype=torch.float64)
    rotated = Rotary(16)(x.float()).double()  # positions 0..6
    for m in range(7):
        assert torch.allclose(rotated[m], rope_by_hand(x[m], m), atol=1e-5), m


def test_rotary_dot_product_depends_on_the_offset_only():
    from normbench.model.layers import Rotary

    torch.manual_seed(0)
    rope = Rotary(32)
    q, k = torch.randn(32), torch.randn(32)
    at = lambda x, pos: rope(x[None, :], torch.tensor([float(pos)]))[0]
    for m, n in ((5, 2), (0, 9), (13, 13)):
        dot = at(q, m) @ at(k, n)
        for t in (1, 7, 100):
            assert torch.allclose(at(q, m + t) @ at(k, n + t), dot, atol=1e-4), (m, n, t)
    assert not torch.allclose(at(q, 5) @ at(k, 2), at(q, 5) @ at(k, 3), atol=1e-3), (
        "the offset itself must matter"
    )


def test_rotary_at_position_zero_is_the_identity_and_keeps_each_pair_norm():
    from normbench.model.layers import Rotary

    torch.manual_seed(0)
    x = torch.randn(2, 3, 10, 8)  # (B, heads, T, head_dim)
    rotated = Rotary(8)(x)
    assert torch.equal(rotated[..., 0, :], x[..., 0, :])
    pairs = lambda t: t[..., :4].pow(2) + t[..., 4:].pow(2)  # pair i = (i, i + d/2)
    assert torch.allclose(pairs(rotated), pairs(x), atol=1e-5)


def test_llama_parameter_count_by_formula_and_no_biases():
    from normbench.model.layers import swiglu_hidden

    cfg = load_group("model", "micro", arch="llama")
    model = llama()
    d, L = cfg.d_model, cfg.n_layer
    hidden = 8 * math.ceil(8 * d / 3 / 8)
    assert hidden == swiglu_hidden(d) == 176 and hidden % 8 == 0 and hidden >= 8 * d / 3
    # Tied embedding (the head's weight), no position embedding; per block q, k, v, o (4 d^2), w1 and
    # w3 (2 d hidden), w2 (hidden d), two RMSNorm gains; the final norm's gain.
    expected = VOCAB * d + L * (4 * d * d + 3 * d * hidden + 2 * d) + d
    assert model.num_params() == expected
    assert model.head.weight is model.tok_emb.weight and model.pos_emb is None
    names = [n for n, _ in model.named_parameters()]
    assert not [n for n in names if "bias" in n]
    assert all(m.bias is None for m in model.modules() if isinstance(m, torch.nn.Linear))
    # model.bias=true is for gpt2: llama has none, and a norm's own bias option is its own.
    ln_model = GPT(
        load_group("model", "micro", arch="llama", bias=True), VOCAB, {"name": "ln"}, {"name": "pre"}
    )
    assert all(m.bias is None for m in ln_model.modules() if isinstance(m, torch.nn.Linear))
    assert ln_model.blocks[0].norm_attn.bias is not None


def test_an_arch_is_one_entry_in_archs(monkeypatch):
    """model.arch is read in one place: a new entry (rotary positions with GPT-2's GELU MLP and biases)
    builds a model whose parts follow it, with no other edit."""
    from normbench.model.layers import ARCHS, MLP, Arch

    monkeypatch.setitem(ARCHS, "rope-gelu", Arch(rotary=True, mlp=MLP, biases=True))
    model = GPT(
        load_group("model", "micro", arch="rope-gelu", bias=True), VOCAB, {"name": "ln"}, {"name": "pre"}
    )
    block = model.blocks[0]
    assert model.pos_emb is None and block.attn.rotary is not None
    assert type(block.mlp) is MLP and block.mlp.fc.bias is not None and block.attn.qkv.bias is not None
    logits, loss = model(torch.randint(0, VOCAB, (2, 8)), torch.randint(0, VOCAB, (2, 8)))
    assert logits.shape == (2, 8, VOCAB) and torch.isfinite(loss)


def test_swiglu_matches_the_hand_formula():
    import torch.nn.functional as F

    mlp = llama().blocks[0].mlp
    x = torch.randn(3, 5, mlp.fc.in_features)
    assert mlp.w1.shape == mlp.w3.shape == (mlp.hidden, x.shape[-1]) and mlp.w2.shape == (
        x.shape[-1],
        mlp.hidden,
    )
    expected = (F.silu(x @ mlp.w1.T) * (x @ mlp.w3.T)) @ mlp.w2.T
    assert torch.allclose(mlp(x), expected, atol=1e-6)


def test_llama_attention_applies_rotary_after_qk_norm():
    from normbench.model.layers import Rotary

    attn = llama(qk_norm="rms").blocks[0].attn
    randomize_norms(attn)
    x = torch.randn(2, 9, attn.qkv.in_features)
    q, k, _ = attn.heads(x)
    B, T, C = x.shape
    raw = [t.view(B, T, attn.n_head, -1).transpose(1, 2) for t in attn.qkv(x).split(C, dim=2)]
    rope = Rotary(C // attn.n_head)
    assert torch.allclose(q, rope(attn.q_norm(raw[0])), atol=1e-6)
    assert torch.allclose(k, rope(attn.k_norm(raw[1])), atol=1e-6)
    # The rotation keeps each head's vector norm, which QK-norm set.
    assert torch.allclose(q.norm(dim=-1), attn.q_norm(raw[0]).norm(dim=-1), atol=1e-5)


def test_arch_is_validated():
    from normbench.core.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown model.arch 'gpt3'; allowed: gpt2, llama"):
        load_group("model", arch="gpt3").validate()
    with pytest.raises(ConfigError, match="head_dim .* 5 must be even"):
        load_group("model", arch="llama", d_model=20, n_head=4).validate()
    for key in ("attn_softcap", "logit_softcap"):
        with pytest.raises(ConfigError, match=f"model.{key} must be a number >= 0"):
            load_group("model", **{key: -1.0}).validate()


@pytest.mark.parametrize("norm", sorted(NORMS))
@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_every_norm_in_every_placement_trains_and_is_causal_in_llama(norm, placement):
    """A few Adam steps on random tokens: the loss stays finite and falls, and eval mode is causal
    (train mode too, except BatchNorm's, whose batch statistics leak by design)."""
    torch.manual_seed(0)
    cfg = load_group(
        "model", "tiny", arch="llama", n_layer=2, qk_norm="rms" if placement == "reordered" else "none"
    )
    model = GPT(cfg, VOCAB, {"name": norm}, {"name": placement, "final_norm": placement != "deepnorm"})
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    idx = torch.randint(VOCAB, (8, cfg.block_size))
    losses = []
    for _ in range(5):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses
    assert causal_leak(model, idx, VOCAB, train_mode=False) < LEAK_TOLERANCE
    if norm != "bn":
        assert causal_leak(model, idx, VOCAB, train_mode=True) < LEAK_TOLERANCE


# ---------------------------------------------------------------- soft-capping


def test_attention_softcap_caps_the_logits_and_matches_the_hand_computation():
    import torch.nn.functional as F

    cap = 2.0
    attn = (
        GPT(load_group("model", "micro", attn_softcap=cap), VOCAB, {"name": "ln"}, {"name": "pre"})
        .blocks[0]
        .attn
    )
    with torch.no_grad():
        attn.qkv.weight.mul_(30)  # logits far beyond the cap
    x = torch.randn(2, 10, attn.qkv.in_features)
    q, k, v = attn.heads(x)
    raw = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    assert raw.abs().max() > 5 * cap
    capped = cap * torch.tanh(raw / cap)
    future = torch.ones(10, 10, dtype=torch.bool).triu(1)
    assert capped.masked_fill(future, 0).abs().max() <= cap
    by_hand = capped.masked_fill(future, float("-inf")).softmax(-1) @ v
    B, T, C = x.shape
    with torch.no_grad():
        assert torch.allclose(attn(x), attn.proj(by_hand.transpose(1, 2).reshape(B, T, C)), atol=1e-5)
        # The diagnostics read the capped logits, the ones the softmax sees.
        assert attention_logits(q, k, cap).amax() <= cap
        assert torch.allclose(
            attention_logits(q, k, cap).masked_fill(future, 0), capped.masked_fill(future, 0), atol=1e-5
        )
    # Without the cap the attention is SDPA's, which the same weights make very different.
    uncapped = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(uncapped, by_hand, atol=1e-2)


def test_logit_softcap_caps_the_output_logits():
    cap = 0.5
    idx = torch.randint(VOCAB, (2, 16))
    outputs = {}
    for c in (0.0, cap):
        torch.manual_seed(0)
        model = GPT(load_group("model", "micro", logit_softcap=c), VOCAB, {"name": "ln"}, {"name": "pre"})
        with torch.no_grad():
            outputs[c] = model(idx, idx)
    (plain, _), (capped, loss) = outputs[0.0], outputs[cap]
    assert plain.abs().max() > cap
    assert capped.abs().max() <= cap
    assert torch.allclose(capped, cap * torch.tanh(plain / cap), atol=1e-6)
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(capped.flatten(0, 1), idx.flatten()))


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_softcap_zero_is_bit_identical_to_no_cap_code(arch):
    """Cap 0 takes today's path: SDPA, logits untouched. The same numbers as the module computed by hand."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = GPT(
        load_group("model", "micro", arch=arch, attn_softcap=0.0, logit_softcap=0.0),
        VOCAB,
        {"name": "ln"},
        {"name": "pre"},
    )
    idx = torch.randint(VOCAB, (2, 16))
    with torch.no_grad():
        logits, _ = model(idx)
        x = model.tok_emb(idx)
        if model.pos_emb is not None:
            x = x + model.pos_emb(torch.arange(16))
        for block in model.blocks:
            a = block.attn
            h = block.norm_attn(x)
            q, k, v = a.heads(h)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + a.proj(y.transpose(1, 2).reshape(2, 16, -1))
            x = x + block.mlp(block.norm_mlp(x))
        assert torch.equal(logits, model.head(model.norm_final(x)))


# ---------------------------------------------------------------- the new keys keep old runs' identity


def test_new_model_keys_at_their_old_values_leave_the_config_hash_as_before(tmp_path):
    """A config composed before model.arch, the soft-caps and DyT's per-position alpha_init existed (the
    keys deleted) hashes as the same config with arch=gpt2, caps 0 and alpha_init_* null; a report fills
    them into such a run's config."""
    import json

    import yaml
    from omegaconf import OmegaConf, open_dict

    from normbench.core.identity import ADDED_KEYS, config_hash
    from normbench.report.load import load_runs

    cfg = compose_cfg(["model=micro", "norm=dyt"])
    assert {k: OmegaConf.select(cfg, k) for k in ADDED_KEYS} == ADDED_KEYS  # conf/ says the old values
    old = cfg.copy()
    with open_dict(old):
        for key in ADDED_KEYS:
            group, leaf = key.split(".")
            del old[group][leaf]
    assert config_hash(old) == config_hash(cfg)
    for change in (
        "model.arch=llama",
        "model.attn_softcap=30",
        "model.logit_softcap=15.0",
        "norm.alpha_init_attn=0.8",
    ):
        assert config_hash(compose_cfg(["model=micro", "norm=dyt", change])) != config_hash(cfg), change
    for name, conf in (("old", old), ("new", cfg)):
        run = tmp_path / name
        run.mkdir()
        (run / "config.yaml").write_text(yaml.safe_dump(OmegaConf.to_container(conf, resolve=True)))
        (run / "summary.json").write_text(json.dumps({"status": "completed", "final_val_loss": 3.0}))
        (run / "metrics.jsonl").write_text('{"kind": "eval", "step": 0, "val_loss": 4.0}\n')
    runs = load_runs([tmp_path / "old", tmp_path / "new"], warn=print).runs
    for key, value in ADDED_KEYS.items():
        assert runs[key].tolist() == [value, value], key

"""Where the norm sits: the placements of recent models against hand-built blocks, DeepNorm, Post-LN, the final norm."""

from __future__ import annotations

import math

import pytest
import torch

from normbench.config import load_group
from normbench.model import GPT
from normbench.placements import PLACEMENTS

from conftest import build, randomize_norms


# ---------------------------------------------------------------- placements against hand-built blocks


def hand_pre(block, x, scale=1.0):
    x = x + block.attn(ln(block.norm_attn, x) * scale)
    return x + block.mlp(ln(block.norm_mlp, x) * scale)


def hand_post(block, x):
    x = ln(block.norm_attn, x + block.attn(x))
    return ln(block.norm_mlp, x + block.mlp(x))


def ln(norm, x):
    return (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt() * norm.weight + norm.bias


def run_by_hand(model, idx, block_fn):
    x = model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[1]))
    for layer, block in enumerate(model.blocks, start=1):
        x = block_fn(layer, block, x)
    return model.head(ln(model.norm_final, x))


@pytest.mark.parametrize("placement, post_fraction, block_fn", [
    ("lns", None, lambda l, b, x: hand_pre(b, x, scale=1 / math.sqrt(l))),
    ("mixln", 0.25, lambda l, b, x: hand_post(b, x) if l <= 1 else hand_pre(b, x)),
    ("mixln", 0.5, lambda l, b, x: hand_post(b, x) if l <= 2 else hand_pre(b, x)),
    ("mixln", 0.0, lambda l, b, x: hand_pre(b, x)),
    ("mixln", 1.0, lambda l, b, x: hand_post(b, x)),
    ("reordered", None, lambda l, b, x: (lambda x: x + ln(b.norm_mlp_out, b.mlp(x)))(x + ln(b.norm_attn_out, b.attn(x)))),
])
def test_new_placements_match_hand_built_blocks(placement, post_fraction, block_fn):
    options = {} if post_fraction is None else {"post_fraction": post_fraction}
    model = build(placement, **options)
    randomize_norms(model)
    idx = torch.randint(16, (2, 12))
    with torch.no_grad():
        assert torch.allclose(model(idx)[0], run_by_hand(model, idx, block_fn), atol=1e-5)


def test_layer_norm_scaling_has_no_new_parameters():
    assert build("lns").num_params() == build("pre").num_params()


def test_every_placement_is_in_the_registry():
    assert {"lns", "mixln", "reordered"} <= set(PLACEMENTS)


def test_deepnorm_alpha_and_beta_init():
    torch.manual_seed(0)
    n_layer, d = 6, 256
    model = GPT(load_group("model", n_layer=n_layer, d_model=d, n_head=4, block_size=8), 50, {"name": "ln"}, {"name": "deepnorm", "final_norm": False})
    block = model.blocks[0]
    assert block.alpha == pytest.approx((2 * n_layer) ** 0.25)
    beta = (8 * n_layer) ** -0.25
    xavier = lambda fan_in, fan_out, gain: gain * math.sqrt(2.0 / (fan_in + fan_out))  # noqa: E731
    q, k, v = block.attn.qkv.weight.split(d)
    assert q.std().item() == pytest.approx(xavier(d, d, 1.0), rel=0.05)
    assert v.std().item() == pytest.approx(xavier(d, d, beta), rel=0.05)
    assert block.mlp.fc.weight.std().item() == pytest.approx(xavier(d, 4 * d, beta), rel=0.05)
    assert isinstance(model.norm_final, torch.nn.Identity)


def test_final_norm_can_be_turned_off(tmp_path):
    on = GPT(load_group("model"), 16, {"name": "rms"}, {"name": "pre", "final_norm": True})
    off = GPT(load_group("model"), 16, {"name": "rms"}, {"name": "pre", "final_norm": False})
    assert on.num_params() - off.num_params() == load_group("model").d_model


def test_post_placement_normalizes_the_residual_stream():
    """Post-LN: every block's output is a norm's output; Pre-LN's stream is left alone."""
    torch.manual_seed(0)
    idx = torch.randint(16, (2, 8))
    for placement, normalized in (("post", True), ("pre", False)):
        model = GPT(load_group("model", n_layer=2, d_model=32, n_head=2, block_size=8), 16, {"name": "ln", "bias": False},
                    {"name": placement, "final_norm": False})
        outs = []
        model.blocks[-1].register_forward_hook(lambda m, i, o: outs.append(o))
        model(idx)
        per_token = outs[0].std(-1, unbiased=False)
        assert torch.allclose(per_token, torch.ones_like(per_token), atol=1e-3) == normalized

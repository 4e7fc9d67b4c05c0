"""The GPT-2 small preset: model=gpt2 and train=gpt2, nanoGPT's shape and recipe."""

from __future__ import annotations

import pytest
from conftest import compose_cfg

from normbench.model.gpt import GPT
from normbench.training.config import parse_config

GPT2_VOCAB_PADDED = 50304  # GPT-2's 50,257 tokens padded to a multiple of 64, as token shards are


def gpt2_params(block_size: int) -> int:
    """GPT-2 small's parameters counted from its shape: tied embedding, learned positions, 12 blocks."""
    d, layers = 768, 12
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    return GPT2_VOCAB_PADDED * d + block_size * d + layers * block + 2 * d


@pytest.mark.parametrize("block_size", [64, 1024])
def test_the_preset_builds_gpt2_small(block_size):
    run = parse_config(compose_cfg(["model=gpt2", "train=gpt2", f"model.block_size={block_size}"]))
    model = GPT(run.model, GPT2_VOCAB_PADDED, run.norm, run.placement)
    assert model.num_params() == gpt2_params(block_size)
    assert model.num_params() // 100_000 == {64: 1237, 1024: 1244}[block_size]  # 123.7M and 124.4M


def test_the_recipe_is_nanogpts():
    run = parse_config(compose_cfg(["model=gpt2", "train=gpt2"]))
    m, t = run.model, run.train
    assert (m.n_layer, m.n_head, m.d_model, m.block_size, m.dropout) == (12, 12, 768, 1024, 0.0)
    assert (t.lr, t.min_lr / t.lr, t.beta1, t.beta2, t.weight_decay, t.grad_clip) == (
        6e-4,
        pytest.approx(0.1),
        0.9,
        0.95,
        0.1,
        1.0,
    )
    assert t.batch_size * m.block_size == 2**19  # ~0.5M tokens per update
    assert t.batch_size % t.micro_batch_size == 0 and t.compile == "cuda" and t.precision == "bf16"

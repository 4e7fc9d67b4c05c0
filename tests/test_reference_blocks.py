"""Placements against the reference implementations of the models they come from: Hugging Face
transformers' OLMo 2 and Gemma 2 decoder layers, built from a tiny config (nothing downloaded), their
weights copied into normbench's block, the outputs compared.

transformers is a dev dependency (pyproject.toml): imported plainly, so a checkout without it fails here.
"""

from __future__ import annotations

import torch
from transformers import Gemma2Config, Olmo2Config
from transformers.models.gemma2.modeling_gemma2 import Gemma2DecoderLayer, Gemma2RotaryEmbedding
from transformers.models.olmo2.modeling_olmo2 import Olmo2DecoderLayer, Olmo2RotaryEmbedding

from normbench.model.gpt import GPT
from normbench.model.layers import swiglu_hidden
from normbench.training.config import load_group

ROPE = {"rope_type": "default", "rope_theta": 10000.0}  # normbench's Rotary base


def llama_block(placement: str, **model):
    """Block 0 of a micro model.arch=llama (rotary, SwiGLU, no biases) with norm=rms, as eval."""
    torch.manual_seed(0)
    cfg = load_group("model", "micro", arch="llama", **model)
    return GPT(cfg, 32, {"name": "rms", "eps": 1e-6}, {"name": placement}).blocks[0].eval(), cfg


def copy_linears(block, attn, mlp) -> None:
    """normbench's fused qkv and SwiGLU fc (gate rows, then up rows) into the reference's separate ones."""
    d = block.attn.proj.weight.shape[0]
    with torch.no_grad():
        for ref, ours in zip((attn.q_proj, attn.k_proj, attn.v_proj), block.attn.qkv.weight.split(d)):
            ref.weight.copy_(ours)
        attn.o_proj.weight.copy_(block.attn.proj.weight)
        mlp.gate_proj.weight.copy_(block.mlp.w1)
        mlp.up_proj.weight.copy_(block.mlp.w3)
        mlp.down_proj.weight.copy_(block.mlp.w2)


def randomize(*norms) -> None:
    """Gains away from 1, so a norm wired to the wrong place cannot hide."""
    with torch.no_grad():
        for norm in norms:
            norm.weight.copy_(torch.rand_like(norm.weight) + 0.5)


def causal_mask(t: int) -> torch.Tensor:
    """The additive (1, 1, T, T) mask the reference's eager attention takes."""
    return torch.full((t, t), float("-inf")).triu(1)[None, None]


def test_reordered_block_matches_transformers_olmo2_decoder_layer():
    """placement=reordered with model.qk_norm=rms, qk_norm_scope=flat is OLMo 2's decoder layer:
    x + RMSNorm(attn(x)), then x + RMSNorm(mlp(x)), with RMSNorm on the whole q and k before rotary.
    The embedding norm is the model's, outside the layer, and not compared here."""
    block, cfg = llama_block("reordered", qk_norm="rms", qk_norm_scope="flat")
    d, heads = cfg.d_model, cfg.n_head
    config = Olmo2Config(
        hidden_size=d, intermediate_size=swiglu_hidden(d), num_attention_heads=heads,
        num_key_value_heads=heads, num_hidden_layers=1, vocab_size=32, rms_norm_eps=1e-6,
        rope_parameters=ROPE, attention_bias=False, hidden_act="silu",
    )  # fmt: skip
    config._attn_implementation = "eager"
    ref = Olmo2DecoderLayer(config, layer_idx=0).eval()
    copy_linears(block, ref.self_attn, ref.mlp)
    randomize(block.norm_attn_out, block.norm_mlp_out, block.attn.q_norm, block.attn.k_norm)
    with torch.no_grad():
        for theirs, ours in (
            (ref.post_attention_layernorm, block.norm_attn_out),
            (ref.post_feedforward_layernorm, block.norm_mlp_out),
            (ref.self_attn.q_norm, block.attn.q_norm),
            (ref.self_attn.k_norm, block.attn.k_norm),
        ):
            theirs.weight.copy_(ours.weight)
    x = torch.randn(2, 12, d)
    cos_sin = Olmo2RotaryEmbedding(config)(x, torch.arange(12)[None])
    with torch.no_grad():
        expected = ref(x, attention_mask=causal_mask(12), position_embeddings=cos_sin)
        torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=1e-5)


def test_peri_block_matches_transformers_gemma2_decoder_layer():
    """placement=peri with model.attn_softcap=50 is Gemma 2's sandwich layer:
    x + N(attn(N(x))), then x + N(mlp(N(x))), the attention logits soft-capped at 50.

    Mapped where Gemma 2 differs in form only: its RMSNorm scales by (1 + weight), so its weight is ours
    minus 1; its MLP is a GeGLU (tanh GELU), set to SiLU here to compare with normbench's SwiGLU; its
    query scale 1/sqrt(query_pre_attn_scalar) set to 1/sqrt(head_dim), normbench's; every layer full
    attention (Gemma 2 alternates with a 4096-token sliding window, longer than any sequence here). The
    embeddings' sqrt(d_model) scale and the final logit soft-cap are the model's, outside the layer."""
    block, cfg = llama_block("peri", attn_softcap=50.0)
    d, heads = cfg.d_model, cfg.n_head
    config = Gemma2Config(
        hidden_size=d, intermediate_size=swiglu_hidden(d), num_attention_heads=heads,
        num_key_value_heads=heads, head_dim=d // heads, num_hidden_layers=1, vocab_size=32,
        rms_norm_eps=1e-6, rope_parameters=ROPE, hidden_activation="silu",
        query_pre_attn_scalar=d // heads, attn_logit_softcapping=50.0,
        layer_types=["full_attention"],
    )  # fmt: skip
    config._attn_implementation = "eager"
    ref = Gemma2DecoderLayer(config, layer_idx=0).eval()
    copy_linears(block, ref.self_attn, ref.mlp)
    randomize(block.norm_attn, block.norm_attn_out, block.norm_mlp, block.norm_mlp_out)
    with torch.no_grad():
        for theirs, ours in (
            (ref.input_layernorm, block.norm_attn),
            (ref.post_attention_layernorm, block.norm_attn_out),
            (ref.pre_feedforward_layernorm, block.norm_mlp),
            (ref.post_feedforward_layernorm, block.norm_mlp_out),
        ):
            theirs.weight.copy_(ours.weight - 1.0)  # Gemma's (1 + weight)
    x = torch.randn(2, 12, d)
    cos_sin = Gemma2RotaryEmbedding(config)(x, torch.arange(12)[None])
    with torch.no_grad():
        expected = ref(x, position_embeddings=cos_sin, attention_mask=causal_mask(12))
        torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=1e-5)

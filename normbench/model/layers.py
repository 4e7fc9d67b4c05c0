"""The two sub-layers every block wraps: causal self-attention and the MLP (GELU, or SwiGLU under
``model.arch=llama``), plus rotary position embeddings, and ``ARCHS``: what each ``model.arch`` chooses.

Both sub-layers are built from the model's config whole, ``cfg``: a ``normbench.model.gpt.ModelConfig``
(read, not imported: gpt.py builds on this module), as nanoGPT's layers take its ``GPTConfig``.

The projections are named so the diagnostics can find them: ``attn.qkv`` (input),
``attn.proj`` (output), ``mlp.fc`` (input), ``mlp.proj`` (output); QK-norm's two norms
are ``attn.q_norm`` and ``attn.k_norm``, the values' ``attn.v_norm``, the output gate ``attn.gate``. The
output projections write into the residual stream and carry ``residual_proj = True``,
which the initialisation scales.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def softcap(z: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(z / cap): z squashed smoothly into (-cap, cap) (Gemma 2's soft-capping)."""
    return torch.tanh(z / cap) * cap


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    """Rotary position embeddings (RoFormer, Su et al. 2021, arXiv 2104.09864), the rotate-half form.

    Channel i of a head is paired with channel i + head_dim/2, and the pair at position m is
    rotated by the angle m * base^(-2i/head_dim): q·k then depends on the positions only
    through their difference. No parameters; cos and sin are cached per length and device.
    """

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head_dim, got {head_dim}")
        self.head_dim, self.base = head_dim, base
        self._cache: dict = {}

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of each position's angles, (len(positions), head_dim), in float32."""
        inv_freq = self.base ** (
            -torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=positions.device) / self.head_dim
        )
        angles = positions.float()[:, None] * inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., T, head_dim) rotated by positions 0..T-1 (or the given ``positions``, length T)."""
        if positions is None:
            key = (x.shape[-2], x.device)
            if key not in self._cache:
                self._cache = {key: self.cos_sin(torch.arange(x.shape[-2], device=x.device))}
            cos, sin = self._cache[key]
        else:
            cos, sin = self.cos_sin(positions)
        xf = x.float()
        return (xf * cos + rotate_half(xf) * sin).to(x.dtype)


@dataclass(frozen=True)
class AttentionNorms:
    """The norms inside attention: each a zero-argument builder, or None for none, and what it spans.

    ``make_qk`` builds QK-norm, one norm for the queries and one for the keys, applied before the
    logits; ``make_v`` one norm on the values. A scope says over what: ``head``, over ``head_dim``
    with one norm shared by all heads (ViT-22B, Gemma 3, Qwen3), or ``flat``, over all heads'
    channels (d_model) at once before the split into heads (OLMo 2; HybridNorm's QKV-norm).
    """

    make_qk: Callable[[], nn.Module] | None = None
    make_v: Callable[[], nn.Module] | None = None
    qk_scope: str = "head"
    v_scope: str = "head"


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``F.scaled_dot_product_attention``.

    Built from the model's config and the ``AttentionNorms`` inside it (QK-norm, the norm on v;
    none by default). Rotary embeddings (``model.arch=llama``) rotate q and k after QK-norm (OLMo 2,
    Qwen3). ``heads(x)`` gives the q, k, v the attention uses, so the diagnostics can compute the
    logits that SDPA keeps to itself. ``model.attn_softcap`` > 0 caps the logits, cap * tanh(logits
    / cap), before the softmax (Gemma 2): SDPA takes no such cap, so then the softmax is computed
    explicitly. ``model.attn_gate`` multiplies the attention's output, before the output
    projection, by sigmoid(x W_g) computed from the sub-layer's input x: one gate per channel of
    every head (Qiu et al. 2025's elementwise, head-specific gate; ``attn.gate``).
    """

    def __init__(self, cfg, norms: AttentionNorms):
        super().__init__()
        d_model, bias = cfg.d_model, cfg.linear_bias
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)
        self.proj.residual_proj = True
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.qk_norm = norms.make_qk is not None
        if self.qk_norm:
            self.q_norm, self.k_norm = norms.make_qk(), norms.make_qk()
        self.v_norm = norms.make_v() if norms.make_v is not None else None
        self.qk_flat, self.v_flat = norms.qk_scope == "flat", norms.v_scope == "flat"
        self.rotary = Rotary(d_model // cfg.n_head) if cfg.architecture.rotary else None
        self.softcap = float(cfg.attn_softcap)
        self.scale: float | None = (
            None  # the logits' scale; None: SDPA's 1/sqrt(head_dim) (μP sets 1/head_dim)
        )
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.gate = nn.Linear(d_model, d_model, bias=bias) if cfg.attn_gate else None

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as (B, n_head, T, head_dim), QK-norm (and V's norm) then rotary embeddings applied."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)

        # A norm acts on the last dimension: the flat (B, T, C) view normalizes all heads' channels
        # together, the (B, T, n_head, head_dim) view each head on its own.
        def split(t):
            return t.view(B, T, self.n_head, C // self.n_head)

        if self.qk_norm:
            q, k = (
                (norm(t) if self.qk_flat else norm(split(t)))
                for norm, t in ((self.q_norm, q), (self.k_norm, k))
            )
        if self.v_norm is not None:
            v = self.v_norm(v) if self.v_flat else self.v_norm(split(v))
        q, k, v = (split(t).transpose(1, 2) for t in (q, k, v))
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.heads(x)
        if self.softcap > 0:
            scale = q.shape[-1] ** -0.5 if self.scale is None else self.scale
            logits = softcap((q @ k.transpose(-2, -1)) * scale, self.softcap)
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            weights = self.attn_dropout(logits.masked_fill(future, float("-inf")).softmax(-1))
            y = weights @ v
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0, scale=self.scale
            )
        y = y.transpose(1, 2).reshape(B, T, C)
        if self.gate is not None:
            y = y * torch.sigmoid(self.gate(x))
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    """proj(gelu(fc x)), 4 d_model wide inside: GPT-2's MLP."""

    def __init__(self, cfg):
        super().__init__()
        d_model = cfg.d_model
        self.fc = nn.Linear(d_model, 4 * d_model, bias=cfg.linear_bias)
        self.proj = nn.Linear(4 * d_model, d_model, bias=cfg.linear_bias)
        self.proj.residual_proj = True
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.from_hidden(self.fc(x))

    def from_hidden(self, hidden: torch.Tensor, gate_gain: float = 1.0) -> torch.Tensor:
        """The MLP after ``fc``; ``gate_gain`` scales GELU's input (nGPT's sqrt(d_model))."""
        if gate_gain != 1.0:
            hidden = hidden * gate_gain
        return self.dropout(self.proj(F.gelu(hidden)))


def swiglu_hidden(d_model: int) -> int:
    """8/3 d rounded up to a multiple of 8: SwiGLU's hidden width at about the GELU MLP's parameters."""
    return 8 * math.ceil(8 * d_model / 3 / 8)


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x), no biases (Shazeer 2020, arXiv 2002.05202; LLaMA).

    The gate w1 and the up projection w3 are one matrix, ``fc`` (w1's rows first, then w3's),
    and w2 is ``proj``: the names the diagnostics, DeepNorm's init and weight decay look for.
    ``w1``, ``w3`` and ``w2`` give the three weights as views.
    """

    def __init__(self, cfg):
        super().__init__()
        self.hidden = swiglu_hidden(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 2 * self.hidden, bias=False)
        self.proj = nn.Linear(self.hidden, cfg.d_model, bias=False)
        self.proj.residual_proj = True
        self.dropout = nn.Dropout(cfg.dropout)

    @property
    def w1(self) -> torch.Tensor:
        return self.fc.weight[: self.hidden]

    @property
    def w3(self) -> torch.Tensor:
        return self.fc.weight[self.hidden :]

    @property
    def w2(self) -> torch.Tensor:
        return self.proj.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.from_hidden(self.fc(x))

    def from_hidden(self, hidden: torch.Tensor, gate_gain: float = 1.0) -> torch.Tensor:
        """The MLP after ``fc``; ``gate_gain`` scales the gate's input, w1 x (nGPT's sqrt(d_model))."""
        gate, up = hidden.chunk(2, dim=-1)
        if gate_gain != 1.0:
            gate = gate * gate_gain
        return self.dropout(self.proj(F.silu(gate) * up))


@dataclass(frozen=True)
class Arch:
    """What one ``model.arch`` chooses; the model and its blocks read this and never the arch's name."""

    rotary: bool  # rotary embeddings on q and k; otherwise a learned position embedding is added
    mlp: Callable[..., nn.Module]  # the MLP sub-layer, built from the model's config
    biases: bool  # whether the linear layers take model.bias; False: no biases anywhere


# gpt2: GPT-2's block (learned position embedding, GELU MLP, biases as model.bias says);
# llama: LLaMA's (rotary embeddings, SwiGLU MLP, no biases in any linear layer).
ARCHS = {
    "gpt2": Arch(rotary=False, mlp=MLP, biases=True),
    "llama": Arch(rotary=True, mlp=SwiGLU, biases=False),
}

"""The two sub-layers every block wraps: causal self-attention and the MLP (GELU, or SwiGLU under
``model.arch=llama``), plus rotary position embeddings.

The projections are named so the diagnostics can find them: ``attn.qkv`` (input),
``attn.proj`` (output), ``mlp.fc`` (input), ``mlp.proj`` (output); QK-norm's two norms
are ``attn.q_norm`` and ``attn.k_norm``, the values' ``attn.v_norm``, the output gate ``attn.gate``. The
output projections write into the residual stream and carry ``residual_proj = True``,
which the initialisation scales.
"""

from __future__ import annotations

import math

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


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``F.scaled_dot_product_attention``.

    ``make_qk_norm`` (optional) builds QK-norm: one norm for the queries and one for the
    keys, applied before the logits q·k/sqrt(head_dim). ``qk_norm_scope`` says over what:
    ``head``, over ``head_dim`` with one norm shared by all heads (ViT-22B, Gemma 3, Qwen3), or
    ``flat``, over all heads' channels (d_model) at once before the split into heads (OLMo 2).
    ``make_v_norm`` (optional) builds a norm on the values, over ``head_dim`` per head, or
    over d_model with ``v_norm_scope=flat`` (HybridNorm's QKV-norm). ``rotary`` applies
    rotary embeddings to q and k after QK-norm (OLMo 2, Qwen3). ``heads(x)`` gives the q,
    k, v the attention uses, so the diagnostics can compute the logits that SDPA keeps to itself.
    ``softcap`` > 0 caps the logits, cap * tanh(logits / cap), before the softmax (Gemma 2):
    SDPA takes no such cap, so then the softmax is computed explicitly.
    ``gate`` multiplies the attention's output, before the output projection, by
    sigmoid(x W_g) computed from the sub-layer's input x: one gate per channel of every head
    (Qiu et al. 2025's elementwise, head-specific gate; ``attn.gate``).
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        dropout: float,
        bias: bool,
        make_qk_norm=None,
        rotary: bool = False,
        softcap: float = 0.0,
        qk_norm_scope: str = "head",
        make_v_norm=None,
        v_norm_scope: str = "head",
        gate: bool = False,
    ):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)
        self.proj.residual_proj = True
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)
        self.qk_norm = make_qk_norm is not None
        if self.qk_norm:
            self.q_norm, self.k_norm = make_qk_norm(), make_qk_norm()
        self.v_norm = make_v_norm() if make_v_norm is not None else None
        self.qk_flat, self.v_flat = qk_norm_scope == "flat", v_norm_scope == "flat"
        self.rotary = Rotary(d_model // n_head) if rotary else None
        self.softcap = float(softcap)
        self.scale: float | None = (
            None  # the logits' scale; None: SDPA's 1/sqrt(head_dim) (μP sets 1/head_dim)
        )
        self.attn_dropout = nn.Dropout(dropout)
        self.gate = nn.Linear(d_model, d_model, bias=bias) if gate else None

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
    def __init__(self, d_model: int, dropout: float, bias: bool):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model, bias=bias)
        self.proj = nn.Linear(4 * d_model, d_model, bias=bias)
        self.proj.residual_proj = True
        self.dropout = nn.Dropout(dropout)

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

    def __init__(self, d_model: int, dropout: float):
        super().__init__()
        self.hidden = swiglu_hidden(d_model)
        self.fc = nn.Linear(d_model, 2 * self.hidden, bias=False)
        self.proj = nn.Linear(self.hidden, d_model, bias=False)
        self.proj.residual_proj = True
        self.dropout = nn.Dropout(dropout)

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

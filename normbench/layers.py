"""The two sub-layers every block wraps: causal self-attention and the GELU MLP.

The projections are named so the diagnostics can find them: ``attn.qkv`` (input),
``attn.proj`` (output), ``mlp.fc`` (input), ``mlp.proj`` (output); QK-norm's two norms
are ``attn.q_norm`` and ``attn.k_norm``. The output
projections write into the residual stream and carry ``residual_proj = True``,
which the initialisation scales.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``F.scaled_dot_product_attention``.

    ``make_qk_norm`` (optional) builds QK-norm: one norm for the queries and one for the
    keys, each over ``head_dim`` and shared by all heads, applied before the logits
    q·k/sqrt(head_dim) (ViT-22B, Gemma 3, Qwen3). ``heads(x)`` gives the q, k, v the
    attention uses, so the diagnostics can compute the logits that SDPA keeps to itself.
    """

    def __init__(self, d_model: int, n_head: int, dropout: float, bias: bool, make_qk_norm=None):
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

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as (B, n_head, T, head_dim), QK-norm applied."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.heads(x)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(B, T, C)))


class MLP(nn.Module):
    def __init__(self, d_model: int, dropout: float, bias: bool):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model, bias=bias)
        self.proj = nn.Linear(4 * d_model, d_model, bias=bias)
        self.proj.residual_proj = True
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))

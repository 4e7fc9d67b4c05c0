"""An example of extending normbench from your own package: one norm and one placement.

``MaxNorm`` divides each vector by its largest absolute entry (the L-infinity norm) and applies a
learned gain: a per-token statistic, like RMSNorm's, computed in float32 under half precision.
``ScaledPreBlock`` is Pre-LN with each sub-layer's output scaled by a fixed ``placement.residual_scale``.
"""

from __future__ import annotations

import torch
from torch import nn

from normbench import Block


class MaxNorm(nn.Module):
    """x / (max_i |x_i| + eps) * weight over the last dimension."""

    statistics = "token"  # each vector is normalized by its own statistic, never its neighbours'

    def __init__(self, dim: int, *, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float()  # the statistic in float32 whatever the input's precision
        y = wide / (wide.abs().amax(dim=-1, keepdim=True) + self.eps)
        return (y * self.weight).to(x.dtype)


class ScaledPreBlock(Block):
    """x + s * f(N(x)): Pre-LN with each sub-layer's contribution scaled by s = residual_scale."""

    def __init__(self, spec, make_norm, *, residual_scale: float = 0.5):
        super().__init__(spec, make_norm)  # builds self.attn and self.mlp from the model's config
        self.norm_attn, self.norm_mlp = make_norm("attn"), make_norm("mlp")
        self.residual_scale = residual_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.residual_scale * self.attn(self.norm_attn(x))
        return x + self.residual_scale * self.mlp(self.norm_mlp(x))

"""Where the norm sits in a block: pre, post, peri (sandwich) and DeepNorm, behind one registry.

A placement is a ``Block`` subclass registered with ``@register_placement("name")``
plus one YAML file in ``conf/placement/``. Every block gets the same two sub-layers
and a zero-argument ``make_norm`` factory, so any norm works in any placement and
no block ever looks at which norm it was given.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from normbench.errors import ConfigError
from normbench.layers import MLP, CausalSelfAttention

PLACEMENTS: dict[str, type["Block"]] = {}


def register_placement(name: str):
    def add(cls):
        PLACEMENTS[name] = cls
        cls.placement_name = name
        return cls

    return add


def placement_class(name: str) -> type["Block"]:
    if name not in PLACEMENTS:
        raise ConfigError(f"unknown placement '{name}'", allowed=sorted(PLACEMENTS))
    return PLACEMENTS[name]


class Block(nn.Module):
    """Attention and MLP sub-layers; subclasses add the norms and the residual wiring."""

    def __init__(self, d_model: int, n_head: int, dropout: float, bias: bool, make_norm: Callable[[], nn.Module], n_layer: int):
        super().__init__()
        self.attn = CausalSelfAttention(d_model, n_head, dropout, bias)
        self.mlp = MLP(d_model, dropout, bias)

    def init_weights(self) -> None:
        """Placement-specific initialisation, applied after the model-wide init."""


@register_placement("pre")
class PreNormBlock(Block):
    """x + f(N(x)): the residual stream is never normalized (GPT-2, LLaMA)."""

    def __init__(self, d_model, n_head, dropout, bias, make_norm, n_layer):
        super().__init__(d_model, n_head, dropout, bias, make_norm, n_layer)
        self.norm_attn, self.norm_mlp = make_norm(), make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_attn(x))
        return x + self.mlp(self.norm_mlp(x))


@register_placement("post")
class PostNormBlock(Block):
    """N(x + f(x)): the original Transformer and BERT; needs warm-up (Xiong et al. 2020)."""

    def __init__(self, d_model, n_head, dropout, bias, make_norm, n_layer):
        super().__init__(d_model, n_head, dropout, bias, make_norm, n_layer)
        self.norm_attn, self.norm_mlp = make_norm(), make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm_attn(x + self.attn(x))
        return self.norm_mlp(x + self.mlp(x))


@register_placement("peri")
class PeriNormBlock(Block):
    """x + N_out(f(N_in(x))): the sandwich of Gemma 2 and Peri-LN."""

    def __init__(self, d_model, n_head, dropout, bias, make_norm, n_layer):
        super().__init__(d_model, n_head, dropout, bias, make_norm, n_layer)
        self.norm_attn, self.norm_attn_out = make_norm(), make_norm()
        self.norm_mlp, self.norm_mlp_out = make_norm(), make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.norm_attn_out(self.attn(self.norm_attn(x)))
        return x + self.norm_mlp_out(self.mlp(self.norm_mlp(x)))


@register_placement("deepnorm")
class DeepNormBlock(Block):
    """N(alpha * x + f(x)), alpha = (2N)^(1/4), with value/output/FFN init scaled by beta = (8N)^(-1/4).

    The decoder-only form of DeepNet (Wang et al. 2022), N = number of layers.
    """

    def __init__(self, d_model, n_head, dropout, bias, make_norm, n_layer):
        super().__init__(d_model, n_head, dropout, bias, make_norm, n_layer)
        self.norm_attn, self.norm_mlp = make_norm(), make_norm()
        self.alpha = (2 * n_layer) ** 0.25
        self.beta = (8 * n_layer) ** -0.25

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm_attn(self.alpha * x + self.attn(x))
        return self.norm_mlp(self.alpha * x + self.mlp(x))

    @torch.no_grad()
    def init_weights(self) -> None:
        # DeepNet's init: Xavier-normal everywhere, gain beta on the value, output and FFN
        # matrices, gain 1 on query and key (DeepNet's reference implementation).
        d = self.attn.proj.weight.shape[0]
        q, k, v = self.attn.qkv.weight.split(d, dim=0)
        for weight, gain in ((q, 1.0), (k, 1.0), (v, self.beta), (self.attn.proj.weight, self.beta),
                             (self.mlp.fc.weight, self.beta), (self.mlp.proj.weight, self.beta)):
            nn.init.xavier_normal_(weight, gain=gain)

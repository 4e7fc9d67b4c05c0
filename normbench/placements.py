"""Where the norm sits in a block: pre, post, peri (sandwich), DeepNorm, and the placements of
recent models (LayerNorm Scaling, Mix-LN, OLMo 2's reordered norm, HybridNorm), behind one registry.

A placement is a ``Block`` subclass registered with ``@register_placement("name")``
plus one YAML file in ``conf/placement/``. Every block gets the same two sub-layers,
a ``BlockSpec`` (sizes, depth, its own 1-based layer index) and a zero-argument
``make_norm`` factory, so any norm works in any placement and no block ever looks at
which norm it was given. A placement's own options (``placement.post_fraction``) are
the keyword-only arguments of its constructor, checked by ``check_options``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from normbench.errors import ConfigError
from normbench.layers import MLP, CausalSelfAttention, SwiGLU

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


def placement_options(placement: dict) -> dict:
    """The placement config's block options (all but name and final_norm), checked against its class."""
    cls = placement_class(placement.get("name"))
    params = inspect.signature(cls.__init__).parameters
    allowed = [p.name for p in params.values() if p.kind is p.KEYWORD_ONLY]
    options = {k: v for k, v in placement.items() if k not in ("name", "final_norm")}
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(f"placement '{cls.placement_name}' has no option {', '.join(unknown)}",
                          allowed=[f"placement.{k}" for k in ("final_norm", *allowed)])
    cls.check_options(**options)
    return options


@dataclass(frozen=True)
class BlockSpec:
    """What a block is built from besides its norm: sizes, depth and where it sits."""

    d_model: int
    n_head: int
    dropout: float
    bias: bool
    n_layer: int  # L, the model's depth
    layer: int  # l, this block's 1-based index
    make_qk_norm: Callable[[], nn.Module] | None = None  # QK-norm, or None
    arch: str = "gpt2"  # gpt2: GELU MLP, biases as ``bias`` says; llama: rotary q and k, SwiGLU MLP, no biases
    attn_softcap: float = 0.0  # cap * tanh(logits / cap) on the attention logits; 0 = off
    qk_norm_scope: str = "head"  # QK-norm over head_dim per head, or flat: over d_model before the split
    make_v_norm: Callable[[], nn.Module] | None = None  # a norm on v, or None
    v_norm_scope: str = "head"  # the norm on v over head_dim per head, or flat: over d_model (HybridNorm)
    attn_gate: bool = False  # a sigmoid gate on the attention output (CausalSelfAttention.gate)


class Block(nn.Module):
    """Attention and MLP sub-layers; subclasses add the norms and the residual wiring."""

    def __init__(self, spec: BlockSpec, make_norm: Callable[[], nn.Module]):
        super().__init__()
        llama = spec.arch == "llama"
        bias = spec.bias and not llama
        self.attn = CausalSelfAttention(spec.d_model, spec.n_head, spec.dropout, bias, spec.make_qk_norm,
                                        rotary=llama, softcap=spec.attn_softcap, qk_norm_scope=spec.qk_norm_scope,
                                        make_v_norm=spec.make_v_norm, v_norm_scope=spec.v_norm_scope,
                                        gate=spec.attn_gate)
        self.mlp = SwiGLU(spec.d_model, spec.dropout) if llama else MLP(spec.d_model, spec.dropout, bias)

    @classmethod
    def check_options(cls, **options) -> None:
        """Raise ConfigError for a bad value of the placement's own options (none by default)."""

    def init_weights(self) -> None:
        """Placement-specific initialisation, applied after the model-wide init."""


@register_placement("pre")
class PreNormBlock(Block):
    """x + f(N(x)): the residual stream is never normalized (GPT-2, LLaMA)."""

    def __init__(self, spec, make_norm):
        super().__init__(spec, make_norm)
        self.norm_attn, self.norm_mlp = make_norm(), make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_attn(x))
        return x + self.mlp(self.norm_mlp(x))


@register_placement("post")
class PostNormBlock(Block):
    """N(x + f(x)): the original Transformer and BERT; needs warm-up (Xiong et al. 2020)."""

    def __init__(self, spec, make_norm):
        super().__init__(spec, make_norm)
        self.norm_attn, self.norm_mlp = make_norm(), make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm_attn(x + self.attn(x))
        return self.norm_mlp(x + self.mlp(x))


@register_placement("peri")
class PeriNormBlock(Block):
    """x + N_out(f(N_in(x))): the sandwich of Gemma 2 and Peri-LN."""

    def __init__(self, spec, make_norm):
        super().__init__(spec, make_norm)
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

    def __init__(self, spec, make_norm):
        super().__init__(spec, make_norm)
        self.norm_attn, self.norm_mlp = make_norm(), make_norm()
        self.alpha = (2 * spec.n_layer) ** 0.25
        self.beta = (8 * spec.n_layer) ** -0.25

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


@register_placement("lns")
class LayerNormScalingBlock(PreNormBlock):
    """x + f(N(x) / sqrt(l)) in layer l (1-based): Pre-LN with each norm's output scaled down with depth.

    LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth in Large Language Models"): it keeps
    the deep layers' output variance from growing, so they keep contributing. No new parameters;
    the final norm is not scaled.
    """

    def __init__(self, spec, make_norm):
        super().__init__(spec, make_norm)
        self.scale = spec.layer ** -0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_attn(x) * self.scale)
        return x + self.mlp(self.norm_mlp(x) * self.scale)


@register_placement("mixln")
class MixLNBlock(Block):
    """Post-LN, N(x + f(x)), in the first floor(alpha L) layers; Pre-LN, x + f(N(x)), in the rest.

    Mix-LN (Li et al. 2024): Post-LN's larger gradients in the early layers, Pre-LN's in the deep
    ones. alpha = ``placement.post_fraction`` (0.25, their best for LLaMA models).
    """

    def __init__(self, spec, make_norm, *, post_fraction: float = 0.25):
        super().__init__(spec, make_norm)
        self.check_options(post_fraction=post_fraction)
        self.norm_attn, self.norm_mlp = make_norm(), make_norm()
        # The small epsilon keeps 0.29 * 100 = 28.999... from flooring to 28.
        self.post = spec.layer <= math.floor(post_fraction * spec.n_layer + 1e-9)

    @classmethod
    def check_options(cls, *, post_fraction: float = 0.25) -> None:
        if isinstance(post_fraction, bool) or not isinstance(post_fraction, (int, float)) or not 0.0 <= post_fraction <= 1.0:
            raise ConfigError(f"placement.post_fraction must be a number in [0, 1], got {post_fraction!r}",
                              allowed=["0.0 (all Pre-LN) to 1.0 (all Post-LN)"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The two wirings are exactly those of the post and pre blocks, which own the same four modules.
        return PostNormBlock.forward(self, x) if self.post else PreNormBlock.forward(self, x)


@register_placement("reordered")
class ReorderedNormBlock(Block):
    """x + N(f(x)): the norm on each sub-layer's output only, none on its input (OLMo 2).

    The residual stream is never normalized and neither is the sub-layer's input, so OLMo 2
    pairs it with QK-norm (``model.qk_norm=rms``) to keep the attention logits in check.
    """

    def __init__(self, spec, make_norm):
        super().__init__(spec, make_norm)
        self.norm_attn_out, self.norm_mlp_out = make_norm(), make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.norm_attn_out(self.attn(x))
        return x + self.norm_mlp_out(self.mlp(x))


@register_placement("hybrid")
class HybridNormBlock(Block):
    """y = x + Attn_QKV(x), then x' = N(y) + MLP(N(y)): HybridNorm (Zhuo et al. 2025, arXiv 2503.04598).

    QKV-norm inside attention, one norm each on q, k and v over all heads' channels (d_model)
    before the split into heads, as in HybridNorm's OLMo 2 code base, and no norm on the
    attention's input; the MLP sub-layer in Post-Norm form: the stream after attention is
    normalized and the MLP's residual starts from the normalized stream. The three QKV norms
    are the block's norm (``norm=``), so the placement refuses model.qk_norm and model.v_norm.
    """

    def __init__(self, spec, make_norm):
        if spec.make_qk_norm is not None or spec.make_v_norm is not None:
            raise ConfigError("placement=hybrid puts its own norm (norm=) on q, k and v: model.qk_norm and "
                              "model.v_norm must be none", allowed=["model.qk_norm=none model.v_norm=none"])
        super().__init__(dataclasses.replace(spec, make_qk_norm=make_norm, qk_norm_scope="flat", make_v_norm=make_norm,
                                             v_norm_scope="flat"), make_norm)
        self.norm_mlp = make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm_mlp(x + self.attn(x))
        return h + self.mlp(h)

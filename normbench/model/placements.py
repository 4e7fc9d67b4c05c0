"""Where the norm sits in a block: pre, post, peri (sandwich), DeepNorm, the placements of
recent models (LayerNorm Scaling, Mix-LN, OLMo 2's reordered norm, HybridNorm), ReZero's
norm-free residual and nGPT's normalized transformer, behind one registry.

A placement is a ``Block`` subclass registered with ``@register_placement("name")``
plus one YAML file in ``conf/placement/``. Every block gets the same two sub-layers,
a ``BlockSpec`` (the model's config, its own 1-based layer index) and a ``make_norm(position)``
factory, so any norm works in any placement and no block ever looks at which norm it was
given. A placement that acts outside its blocks (nGPT: the embeddings, the logits, the
weights after each step) names a ``ModelHooks`` subclass, which the model calls. A placement's own options
(``placement.post_fraction``) are the keyword-only arguments of its constructor, checked by ``check_options``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from normbench.core.errors import ConfigError
from normbench.model.layers import AttentionNorms, CausalSelfAttention
from normbench.model.targets import dotted, import_target, refuse_builtin_name

PLACEMENTS: dict[str, type[Block]] = {}


def register_placement(name: str):
    """Class decorator: make a ``Block`` subclass available as ``placement=name``."""

    def add(cls):
        if not (isinstance(cls, type) and issubclass(cls, Block)):
            raise ConfigError(
                f"placement '{name}': {cls!r} is not a subclass of normbench.Block",
                allowed=["class MyBlock(normbench.Block): ..."],
            )
        refuse_builtin_name(PLACEMENTS, "placement", name, cls)
        PLACEMENTS[name] = cls
        cls.placement_name = name
        return cls

    return add


def placement_class(name: str, target: str | None = None) -> type[Block]:
    """The block class of ``placement=name``; a config's ``_target_`` (a user's class) is imported
    and registered."""
    if target is not None and (
        name not in PLACEMENTS or dotted(PLACEMENTS[name]) != target.replace(":", ".")
    ):
        register_placement(name)(import_target(target, "placement", name))
    if name not in PLACEMENTS:
        raise ConfigError(f"unknown placement '{name}'", allowed=sorted(PLACEMENTS))
    return PLACEMENTS[name]


# Keys of a placement config that are not its block's options: the model reads final_norm and
# embedding_norm (a norm before the head, a norm on the embedding layer's output); init and tie_head are
# the placement's own recipe, which model.init and model.tie_head follow unless a run sets them.
NOT_OPTIONS = ("name", "final_norm", "embedding_norm", "init", "tie_head", "_target_")


def placement_options(placement: dict) -> dict:
    """The placement config's block options (all but NOT_OPTIONS), checked against its class, and
    placement.embedding_norm checked."""
    cls = placement_class(placement.get("name"), placement.get("_target_"))
    embedding_norm = placement.get("embedding_norm", cls.embedding_norm)
    if not isinstance(embedding_norm, bool):
        raise ConfigError(
            f"placement.embedding_norm must be true or false, got {embedding_norm!r}",
            allowed=["false", "true"],
        )
    params = inspect.signature(cls.__init__).parameters
    allowed = [p.name for p in params.values() if p.kind is p.KEYWORD_ONLY]
    options = {k: v for k, v in placement.items() if k not in NOT_OPTIONS}
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(
            f"placement '{cls.placement_name}' has no option {', '.join(unknown)}",
            allowed=[f"placement.{k}" for k in ("final_norm", "embedding_norm", *allowed)],
        )
    cls.check_options(**options)
    return options


@dataclass(frozen=True)
class BlockSpec:
    """What a block is built from besides its norm: the model's config whole, where the block sits,
    and the norms inside its attention (model.qk_norm and model.v_norm, or a placement's own)."""

    # The model's config, normbench.model.gpt.ModelConfig (typed loosely: gpt.py imports this module):
    # sizes (d_model, n_head, n_layer = L, ...) and options, as conf/model/*.yaml gives them.
    model: Any
    layer: int  # l, this block's 1-based index
    attention_norms: AttentionNorms = field(default_factory=AttentionNorms)


class ModelHooks(nn.Module):
    """What a placement does outside its blocks; the model calls these for every placement.

    This default does nothing and holds no parameters (a model's state dict is as before);
    nGPT's ``Hypersphere`` is the one placement that overrides it.
    """

    weight_decay = True  # whether the optimizer may decay the model's matrices (normbench.training.optim)
    mup = True  # whether model.param=mup's width scaling applies

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__()

    def embedded(self, x: torch.Tensor) -> torch.Tensor:
        """The embeddings as the first block gets them."""
        return x

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """The head's logits as the loss sees them (before model.logit_softcap)."""
        return logits

    def after_step(self, model: nn.Module) -> None:
        """Called after every optimizer step (and once at init) with the whole model."""


class Block(nn.Module):
    """Attention and MLP sub-layers; subclasses add the norms and the residual wiring.

    ``make_norm(position)`` builds one norm for a position, "attn" or "mlp" (the sub-layer it
    serves): norms with per-position options (DyT's ``alpha_init_attn``) read it.
    """

    attention_cls = CausalSelfAttention  # nGPT's attention subclasses it
    model_hooks = ModelHooks  # what the placement does to the embeddings, logits and weights
    builds_norms = True  # False: the block calls no make_norm, so norm= is ignored (nGPT, ReZero)
    # True: the model normalizes the embedding layer's output with the run's norm before the first block,
    # unless placement.embedding_norm says otherwise (normbench.model.gpt.GPT builds it, as the final norm)
    embedding_norm = False
    scales_norms = False  # True: the block already scales its norms by 1/sqrt(l) (model.ln_scaling)

    def __init__(self, spec: BlockSpec, make_norm: Callable[..., nn.Module]):
        super().__init__()
        self.attn = self.attention_cls(spec.model, spec.attention_norms)
        self.mlp = spec.model.architecture.mlp(spec.model)

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
        self.norm_attn, self.norm_mlp = make_norm("attn"), make_norm("mlp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_attn(x))
        return x + self.mlp(self.norm_mlp(x))


@register_placement("post")
class PostNormBlock(Block):
    """N(x + f(x)): the original Transformer and BERT; needs warm-up (Xiong et al. 2020)."""

    def __init__(self, spec, make_norm):
        super().__init__(spec, make_norm)
        self.norm_attn, self.norm_mlp = make_norm("attn"), make_norm("mlp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm_attn(x + self.attn(x))
        return self.norm_mlp(x + self.mlp(x))


@register_placement("peri")
class PeriNormBlock(Block):
    """x + N_out(f(N_in(x))), and a norm on the embedding layer's output: Peri-LN (Kim et al. 2025,
    arXiv 2502.02732), the sandwich of Gemma 2.

    Each sub-layer's input and output are normalized, the stream never is. Every sub-layer then adds
    about unit RMS to the stream, so the embeddings must enter at that scale too: GPT-2's N(0, 0.02)
    token embedding would be a fiftieth of the first sub-layer's output, and the token's identity is
    lost by the last layer (the model stays at the untrained loss). So the embedding layer's output is
    normalized as well, before the first block (``placement.embedding_norm``, on by default; OLMo-core's
    Peri-LN runs take the same ``embedding_norm``): one more norm of the run's ``norm=``, d_model more
    parameters (2 d_model for norm=ln). Gemma 2 has no embedding norm and multiplies the embeddings by
    sqrt(d_model) instead; ``placement.embedding_norm=false`` gives the bare sandwich.
    """

    embedding_norm = True

    def __init__(self, spec, make_norm):
        super().__init__(spec, make_norm)
        self.norm_attn, self.norm_attn_out = make_norm("attn"), make_norm("attn")
        self.norm_mlp, self.norm_mlp_out = make_norm("mlp"), make_norm("mlp")

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
        self.norm_attn, self.norm_mlp = make_norm("attn"), make_norm("mlp")
        self.alpha = (2 * spec.model.n_layer) ** 0.25
        self.beta = (8 * spec.model.n_layer) ** -0.25

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm_attn(self.alpha * x + self.attn(x))
        return self.norm_mlp(self.alpha * x + self.mlp(x))

    @torch.no_grad()
    def init_weights(self) -> None:
        # DeepNet's init: Xavier-normal everywhere, gain beta on the value, output and FFN
        # matrices, gain 1 on query and key (DeepNet's reference implementation).
        d = self.attn.proj.weight.shape[0]
        q, k, v = self.attn.qkv.weight.split(d, dim=0)
        for weight, gain in (
            (q, 1.0),
            (k, 1.0),
            (v, self.beta),
            (self.attn.proj.weight, self.beta),
            (self.mlp.fc.weight, self.beta),
            (self.mlp.proj.weight, self.beta),
        ):
            nn.init.xavier_normal_(weight, gain=gain)


@register_placement("lns")
class LayerNormScalingBlock(PreNormBlock):
    """x + f(N(x) / sqrt(l)) in layer l (1-based): Pre-LN with each norm's output scaled down with depth.

    LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth in Large Language Models"): it keeps
    the deep layers' output variance from growing, so they keep contributing. No new parameters;
    the final norm is not scaled. The same model as ``placement=pre model.ln_scaling=true``
    (normbench.model.gpt.DepthScaled), which scales the norms of any placement.
    """

    scales_norms = True

    def __init__(self, spec, make_norm):
        super().__init__(spec, make_norm)
        self.scale = spec.layer**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_attn(x) * self.scale)
        return x + self.mlp(self.norm_mlp(x) * self.scale)


@register_placement("rezero")
class ReZeroBlock(Block):
    """x + a * f(x), a a learned scalar per sub-layer initialised at 0, and no norm at all.

    ReZero (Bachlechner et al. 2020, arXiv 2003.04887): at init every block is the identity, so
    signals and gradients pass through any depth unchanged and the model trains without warm-up
    or LayerNorm. The block builds no norm (``norm=`` is ignored); conf/placement/rezero.yaml
    turns the final norm off as well.
    """

    builds_norms = False

    def __init__(self, spec, make_norm):
        super().__init__(spec, make_norm)
        self.alpha_attn = nn.Parameter(torch.zeros(()))
        self.alpha_mlp = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.alpha_attn * self.attn(x)
        return x + self.alpha_mlp * self.mlp(x)


@register_placement("mixln")
class MixLNBlock(Block):
    """Post-LN, N(x + f(x)), in the first floor(alpha L) layers; Pre-LN, x + f(N(x)), in the rest.

    Mix-LN (Li et al. 2024): Post-LN's larger gradients in the early layers, Pre-LN's in the deep
    ones. alpha = ``placement.post_fraction`` (0.25, their best for LLaMA models).
    """

    def __init__(self, spec, make_norm, *, post_fraction: float = 0.25):
        super().__init__(spec, make_norm)
        self.check_options(post_fraction=post_fraction)
        self.norm_attn, self.norm_mlp = make_norm("attn"), make_norm("mlp")
        # The small epsilon keeps 0.29 * 100 = 28.999... from flooring to 28.
        self.post = spec.layer <= math.floor(post_fraction * spec.model.n_layer + 1e-9)

    @classmethod
    def check_options(cls, *, post_fraction: float = 0.25) -> None:
        if (
            isinstance(post_fraction, bool)
            or not isinstance(post_fraction, (int, float))
            or not 0.0 <= post_fraction <= 1.0
        ):
            raise ConfigError(
                f"placement.post_fraction must be a number in [0, 1], got {post_fraction!r}",
                allowed=["0.0 (all Pre-LN) to 1.0 (all Post-LN)"],
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The two wirings are exactly those of the post and pre blocks, which own the same four modules.
        return PostNormBlock.forward(self, x) if self.post else PreNormBlock.forward(self, x)


@register_placement("reordered")
class ReorderedNormBlock(Block):
    """x + N(f(x)): the norm on each sub-layer's output only, none on its input (OLMo 2, arXiv 2501.00656).

    The residual stream is never normalized and neither is the sub-layer's input, so OLMo 2
    pairs it with QK-norm (``model.qk_norm=rms model.qk_norm_scope=flat``) to keep the attention
    logits in check. Every sub-layer adds about unit RMS to the stream while OLMo 2's embeddings
    start at N(0, 0.02) (every parameter, untied from the head) and have trillions of tokens to
    grow: in a few hundred steps they do not, and the token's identity is lost under the sub-layers'
    outputs. So the embedding layer's output is normalized here too (``placement.embedding_norm``,
    on by default, as OLMo-core's ``embedding_norm`` option does, and as peri's): one more norm
    of the run's ``norm=``, d_model more parameters (2 d_model for norm=ln).
    ``placement.embedding_norm=false`` is OLMo 2's wiring exactly.
    """

    embedding_norm = True

    def __init__(self, spec, make_norm):
        super().__init__(spec, make_norm)
        self.norm_attn_out, self.norm_mlp_out = make_norm("attn"), make_norm("mlp")

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
        if spec.attention_norms.make_qk is not None or spec.attention_norms.make_v is not None:
            raise ConfigError(
                "placement=hybrid puts its own norm (norm=) on q, k and v: model.qk_norm and "
                "model.v_norm must be none",
                allowed=["model.qk_norm=none model.v_norm=none"],
            )
        qkv_norm = functools.partial(make_norm, "attn")  # DyT's per-position alpha: the attention's
        flat = AttentionNorms(make_qk=qkv_norm, make_v=qkv_norm, qk_scope="flat", v_scope="flat")
        super().__init__(dataclasses.replace(spec, attention_norms=flat), make_norm)
        self.norm_mlp = make_norm("mlp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm_mlp(x + self.attn(x))
        return h + self.mlp(h)


def unit(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """x / ||x|| along ``dim``, in float32 for a half input (the precision contract of
    normbench.model.norms)."""
    wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return F.normalize(wide, dim=dim).to(x.dtype)


class Scaling(nn.Module):
    """nGPT's learned scaling vector s = raw * (init / scale), ``raw`` stored starting at ``scale``.

    Adam moves ``raw`` by about the learning rate per step, so s moves by about lr * init / scale:
    ``scale`` sets how fast s learns independently of the value it starts at (nGPT, section 2.6).
    """

    def __init__(self, size: int, init: float, scale: float):
        super().__init__()
        self.raw = nn.Parameter(torch.full((size,), float(scale)))
        self.factor = init / scale

    def forward(self) -> torch.Tensor:
        return self.raw * self.factor


class NormalizedAttention(CausalSelfAttention):
    """nGPT's attention: each head's q and k put on the unit sphere (after rotary embeddings), then
    scaled per channel by s_qk (init 1, scale 1/sqrt(d_model)); logits sqrt(head_dim) * q·k (the
    attention's ``scale``, which SDPA, the soft-capped path and the diagnostics all use).
    """

    def __init__(self, cfg, norms: AttentionNorms):
        super().__init__(cfg, norms)
        self.s_qk = Scaling(cfg.d_model, 1.0, cfg.d_model**-0.5)
        self.scale = (
            cfg.d_model // cfg.n_head
        ) ** 0.5  # not 1/sqrt(head_dim): unit q and k have q·k in [-1, 1]

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = super().heads(x)
        # (heads, 1, head_dim) against (B, heads, T, head_dim)
        s_qk = self.s_qk().view(self.n_head, 1, -1).to(q.dtype)
        return unit(q) * s_qk, unit(k) * s_qk, v


class Hypersphere(ModelHooks):
    """nGPT outside its blocks: the embeddings normalized, the logits scaled per token by s_z
    (init 1, scale 1/sqrt(d_model)), every matrix back on the unit sphere after each optimizer
    step, and no weight decay (the weights' norm is fixed anyway)."""

    weight_decay = False
    mup = False  # μP rescales the init, attention scale and logits that nGPT fixes by normalization

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__(d_model, vocab_size)
        self.s_z = Scaling(vocab_size, 1.0, d_model**-0.5)

    def embedded(self, x: torch.Tensor) -> torch.Tensor:
        return unit(x)  # model.arch=gpt2 adds a position embedding: the sum is put back on the sphere

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.s_z().to(logits.dtype)

    @torch.no_grad()
    def after_step(self, model: nn.Module) -> None:
        for module in model.modules():
            # token (= the tied head) and position embeddings, rows of d_model
            if isinstance(module, nn.Embedding):
                module.weight.copy_(unit(module.weight, dim=1))
            elif isinstance(module, NormalizedBlock):
                module.renormalize()


@register_placement("ngpt")
class NormalizedBlock(Block):
    """h <- Norm(h + alpha_A * (Norm(attn(h)) - h)), then the same with alpha_M and the MLP:
    nGPT (Loshchilov et al. 2024, arXiv 2410.01131), where every hidden state is a unit vector.

    Norm is x / ||x||; alpha_A and alpha_M are learned per-channel "eigen learning rates"
    (init ``placement.alpha_init``, scale 1/sqrt(d_model)). The MLP's hidden pre-activations are
    scaled by s_u (SwiGLU's up projection) and s_v * sqrt(d_model) (the gate, GELU's input under
    model.arch=gpt2), both init 1, scale 1. The block builds no norm: ``norm=`` is ignored, and
    ``model.attn_gate=true`` is refused.
    """

    attention_cls = NormalizedAttention
    model_hooks = Hypersphere
    builds_norms = False

    def __init__(self, spec, make_norm, *, alpha_init: float = 0.05):
        if spec.model.attn_gate:
            # Renormalized with the other matrices, x W_g is a cosine in [-1, 1], so the gate moves with
            # the token by at most sigmoid's rise over that range (0.27 to 0.73 without a bias): not
            # Qiu et al. 2025's gate, and nGPT's paper defines none; a scaling factor for it is untested.
            raise ConfigError(
                "placement=ngpt keeps every matrix on the unit sphere, where model.attn_gate's x W_g "
                "would be a cosine in [-1, 1], not the gate of Qiu et al. 2025",
                allowed=["model.attn_gate=false"],
            )
        super().__init__(spec, make_norm)
        self.check_options(alpha_init=alpha_init)
        d_model = spec.model.d_model
        scale = d_model**-0.5
        self.alpha_attn = Scaling(d_model, alpha_init, scale)
        self.alpha_mlp = Scaling(d_model, alpha_init, scale)
        self.s_uv = Scaling(self.mlp.fc.out_features, 1.0, 1.0)
        self.gate_gain = d_model**0.5

    @classmethod
    def check_options(cls, *, alpha_init: float = 0.05) -> None:
        if isinstance(alpha_init, bool) or not isinstance(alpha_init, (int, float)) or not alpha_init > 0:
            raise ConfigError(
                f"placement.alpha_init must be a number > 0, got {alpha_init!r}",
                allowed=["0.05 (nGPT's), or about 1 / n_layer"],
            )

    def mlp_out(self, h: torch.Tensor) -> torch.Tensor:
        return self.mlp.from_hidden(self.mlp.fc(h) * self.s_uv().to(h.dtype), self.gate_gain)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = unit(h + self.alpha_attn().to(h.dtype) * (unit(self.attn(h)) - h))
        return unit(h + self.alpha_mlp().to(h.dtype) * (unit(self.mlp_out(h)) - h))

    def init_weights(self) -> None:
        self.renormalize()

    @torch.no_grad()
    def renormalize(self) -> None:
        """Every matrix's vectors along d_model to unit length: the rows of the input projections
        (attn.qkv, mlp.fc), the columns of the output projections (attn.proj, mlp.proj)."""
        for linear, dim in ((self.attn.qkv, 1), (self.mlp.fc, 1), (self.attn.proj, 0), (self.mlp.proj, 0)):
            linear.weight.copy_(unit(linear.weight, dim=dim))

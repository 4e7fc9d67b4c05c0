"""The mini GPT: embeddings, a stack of placement blocks, an optional final norm, a head (tied by default).

Built from ``ModelConfig`` plus the norm and placement configs; the norm is chosen
by name through ``normbench.model.norms.build_norm`` and the block class through
``normbench.model.placements.placement_class``, so this file never branches on either.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from normbench.core.errors import ConfigError, about
from normbench.model.layers import ARCHS, Arch, AttentionNorms, softcap
from normbench.model.norms import NORMS, build_norm, norm_options
from normbench.model.placements import BlockSpec, placement_class, placement_options
from normbench.model.targets import is_builtin


@dataclass
class ModelConfig:
    """The model's sizes and options. No defaults here: conf/model/*.yaml hold them (one place)."""

    n_layer: int
    n_head: int
    d_model: int
    block_size: int
    dropout: float
    bias: bool
    # gpt2: N(0, 0.02), residual projections / sqrt(2 n_layer); bert: N(0, 0.02), no scaling (Post-LN's);
    # xavier: Xavier-uniform, no scaling; llama: embeddings N(0, 1), linears gpt2's, an untied head
    # N(0, 1/d_model) (torchtitan's). Follows the placement's own (placement.init) unless set.
    init: str
    qk_norm: str  # a norm on q and k per head over head_dim (QK-norm), or none
    arch: str  # gpt2: learned positions, GELU MLP; llama: rotary embeddings, SwiGLU MLP, no biases
    attn_softcap: float  # c * tanh(z / c) on the attention logits before the softmax; 0 = off
    logit_softcap: float  # c * tanh(z / c) on the output logits before the loss; 0 = off
    # sp: the standard parametrization; mup: μP for Adam (Tensor Programs V),
    # docs/norms-and-placements.md#μp-width-transfer
    param: str
    base_width: int | None  # μP's base width: the d_model at which mup equals sp; needed under mup
    attn_gate: bool  # sigmoid(x W_g) times each head's attention output, channel by channel (Qiu et al. 2025)
    qk_norm_scope: (
        str  # head: QK-norm over head_dim per head; flat: over all heads' channels at once (OLMo 2)
    )
    v_norm: str  # a norm on v per head over head_dim, or none
    ln_scaling: bool  # LayerNorm Scaling: each block's norm outputs times 1/sqrt(l), l its 1-based layer
    tie_head: bool  # the head's weight is the token embedding (GPT-2's); false: a matrix of its own

    def validate(self) -> None:
        for key in ("n_layer", "n_head", "d_model", "block_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key} must be a positive integer, got {getattr(self, key)}")
        if self.d_model % self.n_head:
            divisors = [h for h in range(1, self.d_model + 1) if self.d_model % h == 0]
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_head={self.n_head}",
                allowed=[f"n_head={h}" for h in divisors[:10]],
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.init not in INITS:
            raise ConfigError(f"unknown model.init '{self.init}'", allowed=sorted(INITS))
        if self.init == "llama" and self.tie_head:
            raise ConfigError(
                "model.init=llama starts the token embeddings at N(0, 1): a head tied to them would start "
                f"at logits of std about sqrt(d_model) = {self.d_model**0.5:.0f}",
                allowed=["model.tie_head=false"],
            )
        if self.arch not in ARCHS:
            raise ConfigError(f"unknown model.arch '{self.arch}'", allowed=list(ARCHS))
        if self.architecture.rotary and (self.d_model // self.n_head) % 2:
            raise ConfigError(
                f"model.arch={self.arch} rotates pairs of channels: head_dim = d_model / n_head = "
                f"{self.d_model // self.n_head} must be even"
            )
        for key in ("attn_softcap", "logit_softcap"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ConfigError(
                    f"model.{key} must be a number >= 0 (0 = off), got {value!r}",
                    allowed=["0.0 (off)", "a cap > 0, e.g. 30.0"],
                )
        if self.param not in PARAMS:
            raise ConfigError(f"unknown model.param '{self.param}'", allowed=list(PARAMS))
        if self.base_width is not None and (
            isinstance(self.base_width, bool) or not isinstance(self.base_width, int) or self.base_width < 1
        ):
            raise ConfigError(
                f"model.base_width must be a positive integer (or null), got {self.base_width!r}"
            )
        if self.param == "mup" and self.base_width is None:
            raise ConfigError(
                "model.param=mup needs model.base_width, the d_model at which μP equals SP",
                allowed=[f"model.base_width={self.d_model} (this width)", "the narrowest width of a sweep"],
            )
        if not isinstance(self.attn_gate, bool):
            raise ConfigError(
                f"model.attn_gate must be true or false, got {self.attn_gate!r}", allowed=["false", "true"]
            )
        if not isinstance(self.ln_scaling, bool):
            raise ConfigError(
                f"model.ln_scaling must be true or false, got {self.ln_scaling!r}", allowed=["false", "true"]
            )
        if self.qk_norm_scope not in QK_NORM_SCOPES:
            raise ConfigError(
                f"unknown model.qk_norm_scope '{self.qk_norm_scope}'", allowed=list(QK_NORM_SCOPES)
            )
        self.attention_norms()  # a refused or unbuildable QK-norm fails here, in the config's words

    @property
    def architecture(self) -> Arch:
        """What model.arch chooses (positions, MLP, biases): the one place the arch's name is read."""
        return ARCHS[self.arch]

    @property
    def linear_bias(self) -> bool:
        """Whether the linear layers have biases: model.bias, where the arch allows them."""
        return self.bias and self.architecture.biases

    def attention_norms(self) -> AttentionNorms:
        """model.qk_norm (over head_dim, or d_model with scope flat) and model.v_norm (over head_dim)."""
        head_dim = self.d_model // self.n_head
        qk_dim = self.d_model if self.qk_norm_scope == "flat" else head_dim
        return AttentionNorms(
            make_qk=_attn_norm_factory("qk_norm", self.qk_norm, qk_dim, "queries and keys"),
            make_v=_attn_norm_factory("v_norm", self.v_norm, head_dim, "values"),
            qk_scope=self.qk_norm_scope,
        )

    def width_mult(self) -> float:
        """μP's width multiplier m = d_model / base_width; 1 under sp, where nothing is scaled."""
        return self.d_model / self.base_width if self.param == "mup" else 1.0


def _attn_norm_factory(key: str, name: str, dim: int, what: str):
    """A zero-argument builder of ``model.{key}=name`` over ``dim`` channels without a bias, or None for
    none."""
    allowed = ["none", *qk_norms()]
    if name == "none":
        return None
    if name not in NORMS:
        raise ConfigError(f"unknown model.{key} '{name}'", allowed=allowed)
    if name not in allowed:
        kind = (
            "batch statistics, which mix tokens"
            if NORMS[name].statistics == "batch"
            else "no statistics, so it fixes no scale"
        )
        raise ConfigError(f"model.{key}={name} cannot normalize {what} ({kind})", allowed=allowed)
    # No bias, as in ViT-22B and Wortsman et al.: q and k are scaled, not shifted (v alike).
    options = {"bias": False} if "bias" in norm_options(name) else {}
    make = functools.partial(build_norm, name, dim, **options)
    with about(f"model.{key}={name} over {dim} channels"):
        make()
    return make


# sp: the standard parametrization (the init and LR of model.init and train.lr at every width);
# mup: μP for Adam, Tensor Programs V (Yang et al. 2022) Table 3 in its output-multiplier form.
PARAMS = ("sp", "mup")

# head: QK-norm over head_dim, one norm shared by all heads (Qwen3, Gemma 3); flat: over the whole
# d_model-wide q and k before the split into heads (OLMo 2).
QK_NORM_SCOPES = ("head", "flat")


def qk_norms() -> list[str]:
    """The norms QK-norm accepts: those normalizing each vector by its own statistics."""
    return sorted(name for name, cls in NORMS.items() if cls.statistics == "token")


def _init_gpt2(module: nn.Module, n_layer: int, scale_residual: bool = True) -> None:
    """GPT-2's (a Pre-LN recipe): N(0, 0.02), the residual projections / sqrt(2 n_layer) so the stream's
    variance stays put as blocks add to it."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        residual = scale_residual and getattr(module, "residual_proj", False)
        std = 0.02 / math.sqrt(2 * n_layer) if residual else 0.02
        nn.init.normal_(module.weight, mean=0.0, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def _init_xavier(module: nn.Module, n_layer: int) -> None:
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


def _init_bert(module: nn.Module, n_layer: int) -> None:
    """BERT's and the original Transformer's (Post-LN's): N(0, 0.02), no residual scaling. A Post-LN
    block normalizes x + f(x) itself: scaling f(x) down only shrinks what each sub-layer adds."""
    _init_gpt2(module, n_layer, scale_residual=False)


def _init_llama(module: nn.Module, n_layer: int) -> None:
    """LLaMA's, as torchtitan trains it: token embeddings N(0, 1), so each block's first norm meets its
    input at unit scale (a point-wise DyT or Derf, which has no statistics to rescale a 0.02-scale
    input, passes it on 0.02-scale: attention then sees logits near 0 and the model stays at the
    unigram loss); linear layers GPT-2's. The head is untied, N(0, 1 / d_model) (GPT.__init__)."""
    if isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=1.0)
    elif isinstance(module, nn.Linear):
        _init_gpt2(module, n_layer)


INITS = {"gpt2": _init_gpt2, "xavier": _init_xavier, "bert": _init_bert, "llama": _init_llama}


def hidden_weights(model: nn.Module) -> list[nn.Parameter]:
    """The matrices with both dimensions growing with width (μP's hidden weights): every parameter of
    two or more dimensions but the embeddings and the head (tied, it is the token embedding; untied, the
    readout). Weight decay applies to these only; under μP their init std and Adam LR scale with the width."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    embeddings.add(id(model.head.weight))
    return [p for p in model.parameters() if p.dim() >= 2 and id(p) not in embeddings]


class DepthScaled(nn.Module):
    """A block's norm with its output times 1/sqrt(l), l the block's 1-based layer (model.ln_scaling).

    LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth", arXiv 2502.05795) as a model option:
    it scales whatever norms the placement builds (model.qk_norm, model.v_norm and the final norm
    are left alone). Under Pre-LN this is ``placement=lns``; under Post-LN it scales the residual
    stream itself.
    """

    def __init__(self, norm: nn.Module, layer: int):
        super().__init__()
        self.norm = norm
        self.factor = layer**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) * self.factor


def _depth_scaled(make_norm, layer: int):
    """make_norm whose norms are DepthScaled for ``layer``."""
    return lambda *args, **kwargs: DepthScaled(make_norm(*args, **kwargs), layer)


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int, norm: dict, placement: dict):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        norm = dict(norm)
        make_norm = functools.partial(build_norm, norm.pop("name"), cfg.d_model, **norm)
        make_norm()  # fail on a bad norm option now, with the config's words, not deep in a block
        block_cls = placement_class(placement["name"], placement.get("_target_"))
        options = placement_options(placement)
        if cfg.ln_scaling and (block_cls.scales_norms or not block_cls.builds_norms):
            raise ConfigError(
                f"model.ln_scaling=true with placement={placement['name']}: "
                + (
                    "it already scales its norms (lns is pre with ln_scaling)"
                    if block_cls.scales_norms
                    else "the placement builds no norm to scale"
                ),
                allowed=["model.ln_scaling=false", "placement=pre model.ln_scaling=true"],
            )
        attention_norms = cfg.attention_norms()
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        # Rotary embeddings (llama) rotate q and k in every attention layer instead of learned positions.
        self.pos_emb = None if cfg.architecture.rotary else nn.Embedding(cfg.block_size, cfg.d_model)
        embedding_norm = placement.get("embedding_norm", block_cls.embedding_norm)
        # A norm on the embedding layer's output (placement.embedding_norm; peri's and reordered's): the
        # embeddings enter the stream at the unit scale of the sub-layers' normalized outputs, which would
        # drown GPT-2's N(0, 0.02) ones. Elsewhere none, and no parameters (the state dict is as before).
        # placement_options (above) checked that it is a bool.
        self.norm_embedding = make_norm() if embedding_norm else nn.Identity()
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            block_cls(
                BlockSpec(cfg, layer, attention_norms),
                _depth_scaled(make_norm, layer) if cfg.ln_scaling else make_norm,
                **options,
            )
            for layer in range(1, cfg.n_layer + 1)
        )
        self.norm_final = make_norm("final") if placement.get("final_norm", True) else nn.Identity()
        self.head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        # What the placement does outside its blocks (nGPT); for the others nothing, and no parameters.
        self.hooks = block_cls.model_hooks(cfg.d_model, vocab_size)
        if cfg.tie_head:
            self.head.weight = self.tok_emb.weight  # weight tying (Press & Wolf 2017), as in GPT-2
        self.readout_mult: float | None = None  # μP's output multiplier 1/m on the logits; None under SP

        # Each parameter is initialised once: a tied head's weight *is* the token embedding, so the
        # head is skipped and the shared matrix gets the embedding's init (a Linear init would
        # overwrite it with Xavier-uniform, std ~0.1 instead of 0.02). An untied head is an output
        # embedding: N(0, 0.02) as the input one, under every init.
        init = INITS[cfg.init]
        for module in self.modules():
            if module is not self.head:
                init(module, cfg.n_layer)
        if not cfg.tie_head:  # LLaMA's head reads unit-scale inputs: N(0, 1 / d_model) keeps logits O(1)
            std = cfg.d_model**-0.5 if cfg.init == "llama" else 0.02
            nn.init.normal_(self.head.weight, mean=0.0, std=std)
        if cfg.param == "mup":
            if not self.hooks.mup:
                raise ConfigError(
                    f"placement={block_cls.placement_name} keeps every weight at unit norm: μP's "
                    f"width scaling does not apply to it",
                    allowed=["model.param=sp"],
                )
            self._mup(cfg)
        for block in self.blocks:
            block.init_weights()
        self.after_step()  # nGPT's weights start on the unit sphere, as after every step
        if not is_builtin(block_cls):
            self._check_residual_shape(block_cls.placement_name)

    def _check_residual_shape(self, name: str) -> None:
        """A user's block must give the residual stream back in its shape: said now, in the config's words."""
        x = torch.zeros(1, 2, self.cfg.d_model)
        with leaves_no_trace(self), torch.no_grad():
            y = self.blocks[0](x)
        if not isinstance(y, torch.Tensor) or y.shape != x.shape:
            got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
            raise ConfigError(
                f"placement '{name}' turns the residual stream {tuple(x.shape)} into {got}: "
                f"a block must return a tensor of its input's shape"
            )

    @torch.no_grad()
    def after_step(self) -> None:
        """Called by the training loop after every optimizer step: nGPT puts the weights back on the
        unit sphere (normbench.model.placements.Hypersphere); a no-op for every other placement."""
        self.hooks.after_step(self)

    def _mup(self, cfg: ModelConfig) -> None:
        """μP on top of the SP model: hidden init, attention and readout scaling (the LR is the optimizer's).

        docs/norms-and-placements.md#μp-width-transfer: gpt2's N(0, 0.02) is width-free, so its hidden
        matrices get std / sqrt(m) (variance ∝ 1/fan_in, SP's at the base width); Xavier's std already
        falls as 1/sqrt(fan), as does DeepNorm's own init, applied after this. Embeddings and vectors keep
        theirs.
        """
        m = cfg.width_mult()
        if cfg.init in ("gpt2", "bert"):
            with torch.no_grad():
                for p in hidden_weights(self):
                    p.mul_(m**-0.5)
        # 1/head_dim attention, equal to SP's 1/sqrt(head_dim) at the base width (n_head held fixed).
        head_dim = cfg.d_model // cfg.n_head
        for block in self.blocks:
            block.attn.scale = (cfg.base_width / cfg.n_head) ** 0.5 / head_dim
        self.readout_mult = 1.0 / m

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.tok_emb(idx)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(idx.shape[1], device=idx.device))
        x = self.hooks.embedded(self.drop(self.norm_embedding(x)))
        for block in self.blocks:
            x = block(x)
        logits = self.hooks(self.head(self.norm_final(x)))
        if self.readout_mult is not None:
            logits = logits * self.readout_mult
        if self.cfg.logit_softcap > 0:  # Gemma 2: the logits squashed into (-cap, cap) before the loss
            logits = softcap(logits, self.cfg.logit_softcap)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """mean over tokens of log(Z)^2, Z = sum_j exp(logits_j) the softmax normaliser, in float32.

    PaLM's auxiliary loss (Chowdhery et al. 2022), Wortsman et al. 2023's fix for output-logit
    divergence: it keeps log Z near 0 so the logits cannot drift together.
    """
    return logits.float().logsumexp(-1).pow(2).mean()


@contextlib.contextmanager
def leaves_no_trace(model: nn.Module):
    """Run ``model`` for a probe or a trial without lasting effects: BatchNorm's running
    statistics are restored afterwards and the global RNG (CPU, and the model's GPU) is as before."""
    buffers = {name: value.clone() for name, value in model.named_buffers()}
    device = next(model.parameters()).device
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            yield
    finally:
        with torch.no_grad():
            for name, value in model.named_buffers():
                value.copy_(buffers[name])

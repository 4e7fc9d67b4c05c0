"""The normalization zoo: every norm normbench compares, behind one registry.

Each norm is an ``nn.Module`` built as ``cls(dim, **options)`` that normalizes the
last dimension of any ``(..., dim)`` tensor, token by token (BatchNorm excepted,
which is the point of including it). Its ``statistics`` attribute says what it
normalizes by: ``"token"`` (each vector's own), ``"batch"`` or ``None`` (no statistics);
QK-norm accepts the ``"token"`` ones only. Adding a norm is one class decorated with
``@register_norm("name")`` plus one YAML file in ``conf/norm/``.

Precision contract: under bf16/fp16 the statistics are computed in float32 and the
output comes back in the input's dtype. PyTorch's fused ``layer_norm``,
``rms_norm`` and ``group_norm`` kernels already accumulate in float32 for half
inputs (tests/test_norms.py checks this against a float64 reference), so those
norms call them directly; the others upcast explicitly.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from normbench.core.errors import ConfigError
from normbench.model import impls
from normbench.model.impls import implements
from normbench.model.targets import dotted, import_target, refuse_builtin_name

NORMS: dict[str, type[nn.Module]] = {}

_HALF = (torch.float16, torch.bfloat16)


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """Half inputs are upcast for their statistics; float32 and float64 stay as they are."""
    return x.float() if x.dtype in _HALF else x


def _params_for(x: torch.Tensor, *params: torch.Tensor | None) -> tuple:
    """Gains and biases as a fused ATen norm on x's device accepts them.

    The CPU kernels of layer_norm and group_norm take float32 parameters with a half
    input; the CUDA ones ask for one dtype ("expected scalar type BFloat16 but found
    Float"), so there the parameters (dim elements, not the activations) are cast to
    x's dtype; the kernels still accumulate the statistics in float32 (tests/test_norms.py
    checks this against float64 where a GPU is present). Not under autocast, which runs
    both ops in float32 and would otherwise get gains already rounded to x's dtype.
    """
    if x.is_cpu or params[0].dtype == x.dtype or (x.is_cuda and torch.is_autocast_enabled("cuda")):
        return params
    return tuple(None if p is None else p.to(x.dtype) for p in params)


def implementations(model: nn.Module, device: torch.device) -> dict[str, str]:
    """Bind every built-in norm in ``model`` for ``device`` by the process's ``norm.impl``
    (normbench.model.impls.use); return each norm (by its registered name) -> the implementation it
    runs, a user's norm by its own name. Under norm.impl=fused, a ConfigError where one can't."""
    names = {cls: name for name, cls in NORMS.items()}
    bound: dict[str, str] = {}
    for module in model.modules():
        name = names.get(type(module))
        if name is not None:
            how = module.bind(device) if isinstance(module, BuiltinNorm) else impls.chosen(name, device)
            bound.setdefault(name, how)
    impls.require_fused(bound, device)
    return bound


class BuiltinNorm(nn.Module):
    """A built-in norm: the implementation of its ``kind`` (normbench.model.impls) is bound when it is
    built (``bind`` closes its ``__init__``), so that its forward is one call to ``impl``; a norm
    that has moved to another device since binds again at its next call."""

    kind: str  # its entry in impls.TABLE
    bound: Callable  # the math of its kind, eager or fused, for ``device``
    device: torch.device  # where ``bound`` runs
    impl_name: str  # which implementation is bound (impls.EAGER, FUSED_CPU or COMPILED)

    def bind(self, device: torch.device | None = None) -> str:
        """Bind the implementation for ``device`` (by default where its tensors are); return its name."""
        if device is None:
            tensors = itertools.chain(self.parameters(), self.buffers())
            device = next((t.device for t in tensors), torch.device("cpu"))
        if device.type == "cuda" and device.index is None:  # as a tensor's .device names it
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.impl_name, self.bound = impls.choose(self.kind, self, device)
        return self.impl_name

    def impl(self, x: torch.Tensor, *args):
        """The bound implementation on ``x``, bound again first if ``x`` is on another device."""
        if x.device != self.device:
            self.bind(x.device)
        return self.bound(x, *args)


def register_norm(name: str):
    """Class decorator: make a norm available as ``norm=name``.

    A norm is an ``nn.Module`` built as ``cls(dim, **options)`` (its options keyword-only, with
    defaults) that maps ``(..., dim)`` to the same shape, and says what it normalizes by in its
    ``statistics`` attribute: "token" (each vector by its own), "batch" (across the batch) or None.
    """

    def add(cls: type[nn.Module]) -> type[nn.Module]:
        check_norm_class(cls, name)
        refuse_builtin_name(NORMS, "norm", name, cls)
        NORMS[name] = cls
        return cls

    return add


def check_norm_class(cls: type, name: str) -> None:
    """A ConfigError unless ``cls`` is an nn.Module built from the dimension, with a known ``statistics``."""
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ConfigError(f"norm '{name}': {cls!r} is not a torch.nn.Module class")
    try:
        inspect.signature(cls).bind(8)
    except TypeError as err:
        raise ConfigError(
            f"norm '{name}': {dotted(cls)} must be built as {cls.__name__}(dim, **options) ({err})",
            allowed=["def __init__(self, dim: int, *, option=default, ...)"],
        ) from None
    if getattr(cls, "statistics", None) not in STATISTICS:
        raise ConfigError(
            f"norm '{name}': {dotted(cls)}.statistics is {getattr(cls, 'statistics', None)!r}",
            allowed=[repr(s) for s in STATISTICS],
        )


# What a norm normalizes by: each vector's own statistics, the batch's, or none (normbench check tests it).
STATISTICS = ("token", "batch", None)


def batch_norms(model: nn.Module) -> list[str]:
    """The classes of ``model``'s norms that normalize by the batch's statistics (their ``statistics``)."""
    return sorted({type(m).__name__ for m in model.modules() if getattr(m, "statistics", None) == "batch"})


def norm_class(name: str, target: str | None = None) -> type[nn.Module]:
    """The class ``norm=name`` builds; a config's ``_target_`` (a user's class) is imported and registered."""
    if target is not None and (name not in NORMS or dotted(NORMS[name]) != target.replace(":", ".")):
        register_norm(name)(import_target(target, "norm", name))
    if name not in NORMS:
        raise ConfigError(f"unknown norm '{name}'", allowed=sorted(NORMS))
    return NORMS[name]


# Where a model puts a norm: before attention, before the MLP (a block's norms, by the sub-layer
# they serve), or before the head. A norm's ``per_position`` options take a value per position.
POSITIONS = ("attn", "mlp", "final")


def norm_options(name: str) -> dict[str, object]:
    """The options a norm accepts, with their defaults (its constructor's keywords); each of its
    ``per_position`` options K also as K_attn, K_mlp, K_final (None: K's value)."""
    params = inspect.signature(norm_class(name).__init__).parameters
    options = {p.name: p.default for p in params.values() if p.kind is p.KEYWORD_ONLY}
    for key in getattr(NORMS[name], "per_position", ()):
        options.update({f"{key}_{where}": None for where in POSITIONS})
    return options


def check_norm(name: str, options: dict) -> None:
    """An unknown norm, or an option its class does not take, is a ConfigError."""
    options = dict(options)
    norm_class(name, options.pop("_target_", None))
    allowed = norm_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(
            f"norm '{name}' has no option {', '.join(unknown)}",
            allowed=[f"norm.{k}" for k in allowed] or ["(no options)"],
        )


def build_norm(name: str, dim: int, position: str | None = None, **options) -> nn.Module:
    """Build the norm registered as ``name`` for a last dimension of size ``dim``, at ``position``
    (one of POSITIONS, or None): an option K_position that is set overrides K there. ``_target_``
    among the options names a user's class (normbench.model.targets)."""
    check_norm(name, options)
    options.pop("_target_", None)
    for key in getattr(NORMS[name], "per_position", ()):
        chosen = {where: options.pop(f"{key}_{where}", None) for where in POSITIONS}
        if chosen.get(position) is not None:
            options[key] = chosen[position]
    return NORMS[name](dim, **options)


def _check_eps(eps: float) -> float:
    if not eps > 0:
        raise ConfigError(f"norm.eps must be > 0, got {eps}")
    return float(eps)


@register_norm("ln")
class LayerNorm(BuiltinNorm):
    """(x - mean) / sqrt(var + eps) * weight + bias over the channels (Ba et al. 2016)."""

    statistics = "token"
    kind = "ln"

    def __init__(self, dim: int, *, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = _check_eps(eps)
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        self.bind()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.impl(x, self.weight, self.bias, self.eps)


def _layer_norm_cpu(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    # On a CPU the parameters go in as they are (_params_for): at small widths each call shows.
    return F.layer_norm(x, weight.shape, weight, bias, eps)


@implements("ln", eager_cpu=_layer_norm_cpu)
def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    return _layer_norm_cpu(x, *_params_for(x, weight, bias), eps)


@register_norm("rms")
class RMSNorm(BuiltinNorm):
    """x / sqrt(mean(x^2) + eps) * weight: no centring, no bias (Zhang & Sennrich 2019)."""

    statistics = "token"
    kind = "rms"

    def __init__(self, dim: int, *, eps: float = 1e-6):
        super().__init__()
        self.eps = _check_eps(eps)
        self.weight = nn.Parameter(torch.ones(dim))
        self.bind()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.impl(x, self.weight, self.eps)


@implements("rms", fused_cpu="rms_norm")
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # A gain in another dtype than x sends rms_norm down its slow unfused path.
    if weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    return F.rms_norm(x, weight.shape, weight, eps)


@register_norm("bn")
class BatchNorm(BuiltinNorm):
    """Each channel normalized over every token of the batch (B x T) in training.

    Deliberately not causal in train mode: a token's statistics include future
    tokens and other sequences. Eval mode uses the running statistics and is causal.
    The work is done by a child ``nn.BatchNorm1d`` on the flattened (B*T, C) tokens,
    so ``nn.SyncBatchNorm.convert_sync_batchnorm`` can swap it for DDP.

    ``sync`` only matters under data-parallel training (normbench.training.distributed): true
    takes the statistics over the global batch (every rank's tokens), false over each
    rank's share. One process has nothing to synchronize and ignores it.
    """

    statistics = "batch"
    kind = "bn"

    def __init__(self, dim: int, *, eps: float = 1e-5, momentum: float = 0.1, sync: bool = True):
        super().__init__()
        if not 0.0 <= momentum <= 1.0:
            raise ConfigError(f"norm.momentum must be in [0, 1], got {momentum}")
        if not isinstance(sync, bool):
            raise ConfigError(f"norm.sync must be true or false, got {sync!r}", allowed=["true", "false"])
        self.sync = sync
        self.bn = nn.BatchNorm1d(dim, eps=_check_eps(eps), momentum=momentum)
        self.bind()

    @property
    def weight(self) -> nn.Parameter:
        return self.bn.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.impl(x, self.bn)


@implements("bn")
def _batch_norm(x: torch.Tensor, bn: nn.BatchNorm1d) -> torch.Tensor:
    # Half inputs go in as they are: the kernel keeps float32 statistics and float32
    # parameters itself (tests/test_norms.py), and an explicit upcast would double the traffic.
    return bn(x.reshape(-1, x.shape[-1])).reshape(x.shape)


@register_norm("gn")
class GroupNorm(BuiltinNorm):
    """Per token: channels split into ``groups`` groups, each normalized on its own.

    ``F.group_norm`` pools each group over all trailing dims, so a (B, C, T) layout
    would mix time steps and leak the future; flattening to (B*T, C) keeps it per token.
    groups=1 is LayerNorm; groups=dim leaves one element per group (output = bias).
    """

    statistics = "token"
    kind = "gn"

    def __init__(self, dim: int, *, eps: float = 1e-5, groups: int = 4):
        super().__init__()
        if groups < 1 or dim % groups:
            raise ConfigError(
                f"norm.groups={groups} must divide the model width {dim}",
                allowed=[g for g in range(1, dim + 1) if dim % g == 0][:12],
            )
        self.eps = _check_eps(eps)
        self.groups = groups
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.bind()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.impl(x, self.weight, self.bias, self.groups, self.eps)


def _group_norm_cpu(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, groups: int, eps: float
) -> torch.Tensor:
    return F.group_norm(x.reshape(-1, x.shape[-1]), groups, weight, bias, eps).reshape(x.shape)


# fused on a CPU: ATen's CPU group_norm on (tokens, C) is slow (docs/benchmarks.md#groupnorm)
@implements("gn", fused_cpu="group_norm", eager_cpu=_group_norm_cpu)
def _group_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, groups: int, eps: float
) -> torch.Tensor:
    weight, bias = _params_for(x, weight, bias)
    return _group_norm_cpu(x, weight, bias, groups, eps)


class _ScaleNormFunction(torch.autograd.Function):
    """g * x / max(||x||, eps) per token, with the backward written out.

    Autograd's own backward of the composite runs about ten full-size kernels; this one
    runs three: the per-token dot product dy.x, one multiply-add and one scale.
    With n = max(||x||, eps) and s = g / n:
        dx = s * (dy - x * (dy.x) / n^2)   (a clamped n is a constant: dx = s * dy)
        dg = sum over tokens of (dy.x) / n
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
        xf = _at_least_float32(x)
        norm = torch.linalg.vector_norm(xf, dim=-1, keepdim=True)
        clamped = norm.clamp_min(eps)
        # g / n is one value per token: scale by it rather than dividing every element.
        scale = gain / clamped
        ctx.save_for_backward(x, norm, clamped, scale)
        ctx.eps, ctx.gain_dtype = eps, gain.dtype
        return (xf * scale).to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        x, norm, clamped, scale = ctx.saved_tensors
        xf, dyf = _at_least_float32(x), _at_least_float32(dy)
        dot = torch.linalg.vecdot(dyf, xf).unsqueeze(-1)
        # clamp_min passes the gradient where norm >= eps, as torch.clamp_min's own backward does.
        coef = torch.where(norm < ctx.eps, 0.0, dot / (clamped * clamped))
        dx = torch.addcmul(dyf, xf, coef, value=-1).mul_(scale)
        return dx.to(x.dtype), (dot / clamped).sum().to(ctx.gain_dtype), None


def _scale_norm_math(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    """ScaleNorm as plain ops, for torch.compile to fuse (statistics in float32)."""
    xf = _at_least_float32(x)
    return (xf * (gain / torch.linalg.vector_norm(xf, dim=-1, keepdim=True).clamp_min(eps))).to(x.dtype)


implements("scale", fused_cpu="scale_norm", compiled=_scale_norm_math)(_ScaleNormFunction.apply)


@register_norm("scale")
class ScaleNorm(BuiltinNorm):
    """g * x / max(||x||, eps), one learned scalar g initialised to sqrt(dim) (Nguyen & Salazar 2019)."""

    statistics = "token"
    kind = "scale"

    def __init__(self, dim: int, *, eps: float = 1e-5):
        super().__init__()
        self.eps = _check_eps(eps)
        self.weight = nn.Parameter(torch.tensor(math.sqrt(dim)))
        self.bind()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.impl(x, self.weight, self.eps)


def _dyt_math(
    x: torch.Tensor, alpha: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """DyT as plain ops, for torch.compile to fuse into one kernel per pass."""
    y = torch.tanh(alpha * x) * weight.to(x.dtype)
    return y if bias is None else y + bias.to(x.dtype)


@register_norm("dyt")
class DynamicTanh(BuiltinNorm):
    """weight * tanh(alpha * x) + bias with one learned scalar alpha (Zhu et al. 2025): no statistics.

    alpha starts at ``alpha_init``, or per position at ``alpha_init_attn`` / ``_mlp`` / ``_final``
    where set: the DyT paper's LLaMA recipe starts the norms before attention higher than the others.
    """

    statistics = None
    kind = "dyt"
    per_position = ("alpha_init",)

    def __init__(self, dim: int, *, alpha_init: float = 0.5, bias: bool = True):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        self.bind()

    def argument(self, x: torch.Tensor) -> torch.Tensor:
        """What tanh squashes, alpha * x (the saturation diagnostic reads it)."""
        return self.alpha * x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.impl(x, self.alpha, self.weight, self.bias)


@implements("dyt", fused_cpu="dyt", compiled=_dyt_math)
def _dyt(
    x: torch.Tensor, alpha: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    # In place: the product's only reader is tanh, whose backward needs its output alone.
    squashed = torch.tanh_(alpha * x)
    # A half input meets its gain and bias in its own dtype, as under a half model: fp32
    # parameters would promote the output to fp32 and cost a full-size cast back.
    weight = weight.to(x.dtype)
    if bias is None:
        return squashed * weight
    return torch.addcmul(bias.to(x.dtype), squashed, weight)  # one fused multiply-add


def _derf_math(
    x: torch.Tensor, alpha: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Derf as plain ops, in float32 for a half input (erf's argument and the sum), back in x's dtype."""
    xf = _at_least_float32(x)
    squashed = torch.special.erf(alpha * xf + shift)
    y = squashed * weight if bias is None else torch.addcmul(bias, squashed, weight)
    return y.to(x.dtype)


@register_norm("derf")
class DynamicErf(BuiltinNorm):
    """weight * erf(alpha * x + shift) + bias, learned scalars alpha and shift: no statistics.

    Derf ("Stronger Normalization-Free Transformers", arXiv 2512.10938): DyT's point-wise squashing
    with erf in place of tanh and a learned shift s (s0 = 0); alpha0 = 0.5 as in x-transformers' Derf.
    A half input is computed in float32 and rounded once (PyTorch has no fused op for it); on a GPU
    the math is torch.compile'd into one kernel per pass, as DyT's is.
    """

    statistics = None
    kind = "derf"

    def __init__(self, dim: int, *, alpha_init: float = 0.5, bias: bool = True):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha_init)))
        self.shift = nn.Parameter(torch.tensor(0.0))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        self.bind()

    def argument(self, x: torch.Tensor) -> torch.Tensor:
        """What erf squashes, alpha * x + shift (the saturation diagnostic reads it)."""
        return self.alpha * x + self.shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.impl(x, self.alpha, self.shift, self.weight, self.bias)


implements("derf", compiled=_derf_math)(_derf_math)


@register_norm("none")
class NoNorm(nn.Identity):
    """The identity: what training looks like with no normalization at all."""

    statistics = None

    def __init__(self, dim: int):
        super().__init__()


@implements("none")
def _identity(x: torch.Tensor) -> torch.Tensor:
    return x

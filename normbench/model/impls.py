"""Which implementation each norm runs: the table of implementations and the one place that chooses.

Every built-in norm declares its implementations here (``@implements`` on its eager math, in
normbench.model.norms), and its ``forward`` is its parameters plus one call, ``run(kind, x, ...)``:

- ``fused-cpu``: normbench's C++ op (normbench.model.kernels) on a CPU;
- ``compiled``: the norm's plain-op math torch.compile'd (inductor, Triton) on a GPU, where
  PyTorch has no fused op for it;
- ``eager``: PyTorch ops as written (for LayerNorm, BatchNorm, and GroupNorm and RMSNorm on a GPU,
  PyTorch's own fused kernels).

``norm.impl`` chooses for the process (``use``): ``auto`` runs the fused implementation where it
builds, else eager, said once with the reason; ``eager`` runs eager everywhere; ``fused`` requires
the fused one, and a norm or device without one, or a build that fails, is a ConfigError before
training (``resolve``). ``NORMBENCH_KERNELS=0`` makes auto eager on a CPU. Under torch.compile of
the whole model the eager math is traced: inductor fuses it itself.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from normbench.core.errors import ConfigError, first_line
from normbench.model import kernels

MODES = ("auto", "eager", "fused")
EAGER, FUSED_CPU, COMPILED = "eager", "fused-cpu", "compiled"


@dataclass(frozen=True)
class Implementations:
    """One norm's implementations: its eager math ``eager(x, *args)``, and the fused ones it has."""

    eager: Callable
    fused_cpu: str | None = None  # its torch.ops.normbench op, called with the same arguments
    compiled: Callable | None = None  # plain-op math, same arguments, for torch.compile on a GPU
    fused: bool = field(init=False, default=False)  # whether it has either

    def __post_init__(self):
        # read on every forward call: a norm with no fused implementation (LayerNorm, BatchNorm) asks
        # nothing more, at small widths every check is a visible share of the call
        object.__setattr__(self, "fused", self.fused_cpu is not None or self.compiled is not None)


TABLE: dict[str, Implementations] = {}  # norm name -> its implementations: every built-in norm
_mode = {"impl": "auto"}
_said: set[str] = set()  # the fallback lines printed in this process


def implements(kind: str, *, fused_cpu: str | None = None, compiled: Callable | None = None):
    """Decorator on a norm's eager math: enter it, and its fused implementations, in TABLE."""

    def add(eager: Callable) -> Callable:
        TABLE[kind] = Implementations(eager, fused_cpu, compiled)
        return eager

    return add


def use(mode: str) -> None:
    """Set ``norm.impl`` for this process (a run sets it every time: one process may train several)."""
    if mode not in MODES:
        raise ConfigError(f"unknown norm.impl '{mode}'", allowed=list(MODES))
    _mode["impl"] = mode


def run(kind: str, x: torch.Tensor, *args):
    """``kind``'s math on ``x`` with ``args``, by the implementation chosen for x's device."""
    impls = TABLE[kind]
    if impls.fused and _mode["impl"] != "eager" and not torch.compiler.is_compiling():
        if x.is_cpu:
            if impls.fused_cpu is not None and x.numel() > 0 and _kernels():
                return _op(impls.fused_cpu)(x, *args)
        elif impls.compiled is not None and x.is_cuda:
            compiled = _compiled(impls.compiled, x, args)
            if compiled is not None:
                return compiled(x, *args)
    return impls.eager(x, *args)


# ----------------------------------------------------------------------------- the fused CPU kernels

_OPS: dict[str, Callable] = {}


def _op(name: str) -> Callable:
    """torch.ops.normbench.{name}, looked up once: at small widths even the attribute lookups show."""
    if name not in _OPS:
        _OPS[name] = getattr(torch.ops.normbench, name).default
    return _OPS[name]


def _kernels() -> bool:
    """Whether the C++ kernels are loaded; the first time they are not, one line says why and what runs."""
    if kernels.available():
        return True
    if "kernels" not in _said:
        _said.add("kernels")
        names = ", ".join(sorted(kind for kind, impls in TABLE.items() if impls.fused_cpu))
        print(
            f"normbench: fused CPU norm kernels unavailable ({kernels.why()}); the norms {names} "
            "run eager PyTorch on the CPU (slower)",
            file=sys.stderr,
        )
    return False


# ----------------------------------------------------------------------------- torch.compile on a GPU

_COMPILED: dict[Callable, Callable | None] = {}  # math -> its compiled version, None where compiling failed


def _compiled(fn: Callable, x: torch.Tensor, args: tuple) -> Callable | None:
    """``fn`` torch.compile'd (dynamic shapes: a new width or batch needs no recompile), or None.

    Compiled on the first call by a trial on a two-token copy of the input and of the arguments
    (forward and, outside inference mode, backward), so that a failure to compile (no Triton, an
    unsupported GPU) is told apart from anything the real call raises: a trial that fails makes
    ``fn`` eager for the process, with one line; an error of a real call (out of memory) propagates.
    """
    if fn not in _COMPILED:
        compiled = torch.compile(fn, dynamic=True)
        grad = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        tiny = x.detach()[..., :2, :].clone().requires_grad_(grad) if x.dim() > 1 else x.detach().clone()
        copies = [
            a.detach().clone().requires_grad_(grad and a.requires_grad) if torch.is_tensor(a) else a
            for a in args
        ]
        try:
            out = compiled(tiny, *copies)
            if grad:
                out.float().sum().backward()
            _COMPILED[fn] = compiled
        except Exception as err:  # the trial: compiling failed; eager is slower, not wrong
            _COMPILED[fn] = None
            print(
                f"normbench: torch.compile of {fn.__name__} failed ({first_line(err, 160)}); eager on GPU",
                file=sys.stderr,
            )
    return _COMPILED[fn]


# ----------------------------------------------------------------------------- what a model runs


def builds_kernels(mode: str, device: torch.device) -> bool:
    """Whether a run in ``mode`` on ``device`` would build the C++ kernels when its norms first run:
    the caller builds them first, outside the run's timed phases."""
    return mode != "eager" and device.type == "cpu" and kernels.will_build()


def chosen(kind: str, device: torch.device) -> str:
    """The implementation the norm ``kind`` runs on ``device`` now (building the kernels first if need be)."""
    impls = TABLE.get(kind)
    if impls is None:  # a user's norm runs itself: its own name says which
        return kind
    if _mode["impl"] == "eager":
        return EAGER
    if device.type == "cpu" and impls.fused_cpu is not None:
        return FUSED_CPU if _kernels() else EAGER
    if device.type == "cuda" and impls.compiled is not None:
        return COMPILED if _COMPILED.get(impls.compiled, True) is not None else EAGER
    return EAGER


def resolve(model: nn.Module, device: torch.device, names: dict[type, str]) -> dict[str, str]:
    """Each norm kind in ``model`` -> the implementation it runs on ``device`` (a provenance's ``norm_impl``).

    ``names``: norm class -> its registered name; a user's norm runs itself, named by its own name.
    Under ``norm.impl=fused`` a norm that has no fused implementation here, or whose build or
    compile fails, is a ConfigError now, before training.
    """
    kinds: dict[str, nn.Module] = {}
    for module in model.modules():
        if type(module) in names:
            kinds.setdefault(names[type(module)], module)
    if device.type == "cuda" and _mode["impl"] != "eager":
        for kind, module in kinds.items():  # the compile trial of each GPU-compiled norm, before training
            if kind in TABLE and TABLE[kind].compiled is not None:
                dim = next((p.shape[-1] for p in module.parameters() if p.dim()), 8)
                module(torch.randn(2, dim, device=device))
    impl = {kind: chosen(kind, device) for kind in kinds}
    if _mode["impl"] == "fused":
        unfused = sorted(kind for kind, how in impl.items() if how == EAGER)
        if unfused:
            raise ConfigError(
                f"norm.impl=fused: {', '.join(unfused)} cannot run fused on {device.type} "
                f"({_why_not_fused(TABLE[unfused[0]], device)})",
                allowed=["norm.impl=auto", "norm.impl=eager"],
            )
    return impl


def _why_not_fused(impls: Implementations, device: torch.device) -> str:
    if device.type == "cpu" and impls.fused_cpu is not None:
        return kernels.why() or "the kernels did not load"
    if device.type == "cuda" and impls.compiled is not None:
        return "torch.compile failed"
    return "no fused implementation"

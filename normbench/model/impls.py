"""Which implementation each norm runs: the table of implementations and the one place that chooses.

Every built-in norm declares its implementations here (``@implements`` on its eager math, in
normbench.model.norms), and binds one of them when it is built, again at its first call on another
device (``choose``): its ``forward`` is its parameters plus one call to what it bound.

- ``fused-cpu``: normbench's C++ op (normbench.model.kernels) on a CPU;
- ``compiled``: the norm's plain-op math torch.compile'd (inductor, Triton) on a GPU, where
  PyTorch has no fused op for it;
- ``eager``: PyTorch ops as written (for LayerNorm, BatchNorm, and GroupNorm and RMSNorm on a GPU,
  PyTorch's own fused kernels).

``norm.impl`` (``NormImpl``) chooses for the process (``use``): ``auto`` binds the fused
implementation where it builds, else eager, said once with the reason; ``eager`` binds eager
everywhere; ``fused`` requires the fused one, and a norm or device without one, or a build that
fails, is a ConfigError before training (``require_fused``). ``NORMBENCH_KERNELS=0`` makes auto
eager on a CPU. Under torch.compile of the whole model a fused binding traces the eager math:
inductor fuses it itself.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from normbench.core.errors import ConfigError, first_line
from normbench.model import kernels

EAGER, FUSED_CPU, COMPILED = "eager", "fused-cpu", "compiled"


class NormImpl(enum.StrEnum):
    """``norm.impl``: which implementation the norms bind; an unknown name is a ConfigError."""

    AUTO = "auto"
    EAGER = "eager"
    FUSED = "fused"

    @classmethod
    def _missing_(cls, value):
        raise ConfigError(f"unknown norm.impl '{value}'", allowed=[m.value for m in cls])


MODES = tuple(m.value for m in NormImpl)


@dataclass(frozen=True)
class Implementations:
    """One norm's implementations: its eager math ``eager(x, *args)``, and the fused ones it has."""

    eager: Callable
    fused_cpu: str | None = None  # its torch.ops.normbench op, called with the same arguments
    compiled: Callable | None = None  # plain-op math, same arguments, for torch.compile on a GPU
    eager_cpu: Callable | None = None  # the eager math as a CPU runs it, where it differs (fewer calls)


TABLE: dict[str, Implementations] = {}  # norm name -> its implementations: every built-in norm
_mode = {"impl": NormImpl.AUTO}
_said: set[str] = set()  # the fallback lines printed in this process


def implements(
    kind: str,
    *,
    fused_cpu: str | None = None,
    compiled: Callable | None = None,
    eager_cpu: Callable | None = None,
):
    """Decorator on a norm's eager math: enter it, and its other implementations, in TABLE."""

    def add(eager: Callable) -> Callable:
        TABLE[kind] = Implementations(eager, fused_cpu, compiled, eager_cpu)
        return eager

    return add


def use(mode: str) -> None:
    """Set ``norm.impl`` for this process: the norms built, moved or bound (``choose``) from now on
    bind by it (a run sets it every time: one process may train several)."""
    _mode["impl"] = NormImpl(mode)


def choose(kind: str, module: nn.Module, device: torch.device) -> tuple[str, Callable]:
    """What the built-in norm ``module`` (of kind ``kind``) binds on ``device``: (its name, the callable).

    Building the C++ kernels on a CPU, or trying the torch.compile'd math on a GPU, the first time
    either is asked for.
    """
    impls = TABLE[kind]
    if _mode["impl"] != NormImpl.EAGER:
        if device.type == "cpu" and impls.fused_cpu is not None and _kernels():
            return FUSED_CPU, _fused(_op(impls.fused_cpu), impls.eager, cpu=True)
        if device.type == "cuda" and impls.compiled is not None:
            compiled = _compiled(impls, module, device)
            if compiled is not None:
                return COMPILED, compiled
    if device.type == "cpu" and impls.eager_cpu is not None:
        return EAGER, impls.eager_cpu
    return EAGER, impls.eager


def _fused(fast: Callable, eager: Callable, cpu: bool) -> Callable:
    """``fast``, but the eager math under torch.compile of the whole model (which traces it and fuses it
    itself) and, for a CPU kernel, on an empty tensor."""

    def fused(x: torch.Tensor, *args):
        if torch.compiler.is_compiling() or (cpu and not x.numel()):
            return eager(x, *args)
        return fast(x, *args)

    return fused


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

# plain-op math -> its compiled binding, None where compiling failed
_COMPILED: dict[Callable, Callable | None] = {}


def _compiled(impls: Implementations, module: nn.Module, device: torch.device) -> Callable | None:
    """``impls.compiled`` torch.compile'd (dynamic shapes: a new width or batch needs no recompile), or None.

    Compiled the first time by a trial of ``module`` on two tokens, with copies of its parameters
    (forward and, outside inference mode, backward), so that a failure to compile (no Triton, an
    unsupported GPU) is told apart from anything a real call raises: a trial that fails makes the
    math eager for the process, with one line; an error of a real call (out of memory) propagates.
    """
    fn = impls.compiled
    if fn not in _COMPILED:
        compiled = _fused(torch.compile(fn, dynamic=True), impls.eager, cpu=False)
        grad = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        params = {n: p.detach().clone().requires_grad_(grad) for n, p in module.named_parameters()}
        dim = next((p.shape[-1] for p in params.values() if p.dim()), 8)
        bound = getattr(module, "bound", None)  # the trial calls the compiled math through forward
        module.bound = compiled
        try:
            out = torch.func.functional_call(module, params, (torch.randn(2, dim, device=device),))
            if grad:
                out.float().sum().backward()
            _COMPILED[fn] = compiled
        except Exception as err:  # the trial: compiling failed; eager is slower, not wrong
            _COMPILED[fn] = None
            print(
                f"normbench: torch.compile of {fn.__name__} failed ({first_line(err, 160)}); eager on GPU",
                file=sys.stderr,
            )
        finally:
            module.bound = bound
    return _COMPILED[fn]


# ----------------------------------------------------------------------------- what a model runs


def builds_kernels(mode: str, device: torch.device) -> bool:
    """Whether a run in ``mode`` on ``device`` would build the C++ kernels when its norms are built:
    the caller builds them first, outside the run's timed phases."""
    return mode != NormImpl.EAGER and device.type == "cpu" and kernels.will_build()


def chosen(kind: str, device: torch.device) -> str:
    """The implementation a norm of ``kind`` binds on ``device`` now (building the kernels first if need be);
    a user's norm runs itself: its own name says which."""
    impls = TABLE.get(kind)
    if impls is None:
        return kind
    if _mode["impl"] == NormImpl.EAGER:
        return EAGER
    if device.type == "cpu" and impls.fused_cpu is not None:
        return FUSED_CPU if _kernels() else EAGER
    if device.type == "cuda" and impls.compiled is not None:
        return COMPILED if _COMPILED.get(impls.compiled, True) is not None else EAGER
    return EAGER


def require_fused(bound: dict[str, str], device: torch.device) -> None:
    """Under ``norm.impl=fused``, a ConfigError naming the built-in norms in ``bound`` (kind -> what it
    binds) that bound eager on ``device``."""
    if _mode["impl"] != NormImpl.FUSED:
        return
    unfused = sorted(kind for kind, how in bound.items() if how == EAGER and kind in TABLE)
    if unfused:
        raise ConfigError(
            f"norm.impl=fused: {', '.join(unfused)} cannot run fused on {device.type} "
            f"({_why_not_fused(TABLE[unfused[0]], device)})",
            allowed=["norm.impl=auto", "norm.impl=eager"],
        )


def _why_not_fused(impls: Implementations, device: torch.device) -> str:
    if device.type == "cpu" and impls.fused_cpu is not None:
        return kernels.why() or "the kernels did not load"
    if device.type == "cuda" and impls.compiled is not None:
        return "torch.compile failed"
    return "no fused implementation"

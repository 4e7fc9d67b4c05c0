"""``normbench check``: is a norm or placement sound before a sweep spends hours on it?

One line per property, each with its figure. The properties without which results are wrong (an
output of the right shape with finite values, no future leak, the declared ``statistics`` kept, a
gradient for every parameter, a model that learns) fail the check; the others (the output's dtype,
precision, a state-dict round trip, torch.compile, speed) are reported and flagged with their cost.
Built on what normbench already has: the causal probe (normbench.model.causality), the norm
benchmark and its 1.1x goal (normbench.bench), the training loop.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from normbench.bench import timing
from normbench.bench.goals import GOALS
from normbench.core.configtree import compose
from normbench.core.errors import first_line
from normbench.core.runs import LEARN_MARGIN
from normbench.data import corpus
from normbench.model import extensions
from normbench.model.causality import causal_leak
from normbench.model.gpt import GPT
from normbench.model.norms import build_norm, norm_class
from normbench.model.targets import is_builtin
from normbench.training.config import parse_config

# A model=micro run this long ends well below its corpus's unigram entropy with every built-in norm, the
# point-wise ones (DyT, Derf: about 0.3 nats below at 150 steps) included (docs/extending.md).
LEARN_STEPS = 150
WIDTHS = (256, 1024)  # the widths of the speed line
SPEED_GOAL = GOALS["rms"][1]  # the norm benchmark's goal: at most 1.1x LayerNorm's native op
# What the speed line measures, in its name: the norm's op alone, as a ratio of times (higher is
# slower); a training run's throughput, which normbench report compares, is a ratio of tokens/s
# (higher is faster) over whole steps, where the norm is a small share of the time.
SPEED_NAME = "norm op alone: fwd+bwd time / LayerNorm's"
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
_DTYPE_NAMES = {torch.float64: "float64", torch.float32: "float32", **{v: k for k, v in HALF.items()}}


@dataclass
class Line:
    """One property: its figure, and whether it held (``ok``); ``must``: a failure fails the check."""

    name: str
    figure: str
    ok: bool | None  # None: not applicable here
    must: bool

    @property
    def mark(self) -> str:
        if self.ok is None:
            return "n/a"
        return "ok" if self.ok else ("FAIL" if self.must else "flag")


def _norm_input(dim: int, dtype=torch.float32, offset: float = 0.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(4, 16, dim, generator=gen, dtype=torch.float64) * 3 + offset).to(dtype)


def _randomized(module: torch.nn.Module) -> torch.nn.Module:
    """Parameters moved off their init (ones, zeros), so a round trip or a wiring cannot hide behind them."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module


def norm_lines(name: str, options: dict, dim: int) -> list[Line]:
    """The lines of the norm alone: shapes and dtypes, precision, statistics, gradients, state dict."""
    make = lambda: build_norm(name, dim, **copy.deepcopy(options))
    norm = _randomized(make()).train()
    declared = norm_class(name).statistics
    lines = [*_output_lines(norm, dim)]

    # Statistics in float32 under bf16: against the module's own float64 result on the same rounded
    # input, an error within twice that result's bf16 rounding; a large common offset (64) makes
    # statistics kept in bf16 miss by more.
    x = _norm_input(dim, torch.bfloat16, offset=64.0)
    with torch.no_grad():
        exact = copy.deepcopy(norm).double()(x.double())
        err = (norm(x).double() - exact).abs().max().item()
        rounding = (exact.to(torch.bfloat16).double() - exact).abs().max().item()
    ok = err <= 2 * rounding * (1 + 1e-3)  # a float32 result can round to the neighbouring bf16 value
    lines.append(
        Line("float32 statistics under bf16", f"max error {err:.2g} vs rounding {rounding:.2g}", ok, False)
    )

    # Declared statistics: perturb another position, and another sample, and watch one output vector.
    x = _norm_input(dim)
    base = norm(x)[0, 0]
    moved = {}
    for what, index in (("position", (0, slice(1, None))), ("sample", (slice(1, None),))):
        other = x.clone()
        other[index] += 5.0
        moved[what] = (norm(other)[0, 0] - base).abs().max().item()
    mixes = max(moved.values()) > 1e-5
    figure = (
        f"declares {declared!r}; change from another position {moved['position']:.2g}, "
        f"sample {moved['sample']:.2g}"
    )
    lines.append(Line("declared statistics", figure, declared == "batch" or not mixes, True))

    lines.append(_gradient_line(norm, lambda: norm(_norm_input(dim))))

    twin = make()
    twin.load_state_dict(norm.state_dict())
    with torch.no_grad():
        diff = (twin.train()(x) - norm(x)).abs().max().item()
    lines.append(Line("state_dict round trip", f"max difference {diff:.2g}", diff == 0.0, False))
    return lines


def _output_lines(norm: torch.nn.Module, dim: int) -> list[Line]:
    """Shape and finite values, which must hold; the output's dtype, flagged with its cost when it is not
    the input's (a wider one holds every activation after the norm at that width)."""
    shapes, dtypes = [], []
    for label, dtype in (("fp32", torch.float32), *HALF.items()):
        try:
            y = norm(_norm_input(dim, dtype))
        except RuntimeError as err:  # fp16 on a device without it
            shapes.append(f"{label} unsupported ({type(err).__name__})")
            continue
        wrong = [
            *([f"shape {tuple(y.shape)}"] if y.shape != (4, 16, dim) else []),
            *(["non-finite values"] if not torch.isfinite(y).all() else []),
        ]
        shapes.append(f"{label} {'; '.join(wrong) or 'ok'}")
        if y.dtype != dtype:
            ratio = y.element_size() / dtype.itemsize
            cost = {1: "as much activation memory", 2: "twice the activation memory"}.get(
                ratio, f"{ratio:g}x the activation memory"
            )
            dtypes.append(f"returns {_DTYPE_NAMES.get(y.dtype, y.dtype)} for {label} input: {cost}")
    dtype_figure = "; ".join(dtypes) + "; cast back with .to(x.dtype)" if dtypes else "the input's"
    return [
        Line(
            "output shape, finite values",
            ", ".join(shapes),
            all(s.endswith(" ok") or "unsupported" in s for s in shapes),
            True,
        ),
        Line("output dtype", dtype_figure, not dtypes, False),
    ]


def _gradient_line(module: torch.nn.Module, forward) -> Line:
    """Every parameter gets a nonzero gradient from a random projection of the output."""
    module.zero_grad(set_to_none=True)
    y = forward()
    weights = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).to(y.dtype)
    if y.requires_grad:  # an output that no parameter touches (x * 0) leaves every parameter without one
        (y * weights).sum().backward()
    named = list(module.named_parameters())
    dead = [n for n, p in named if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]
    module.zero_grad(set_to_none=True)
    figure = f"{len(named) - len(dead)} of {len(named)} parameters" + (
        f"; none to {', '.join(dead)}" if dead else ""
    )
    return Line("gradients reach every parameter", figure, not dead, True)


def compile_line(module: torch.nn.Module, x: torch.Tensor) -> Line:
    try:
        with torch.no_grad():
            diff = (torch.compile(module)(x) - module(x)).abs().max().item()
    except Exception as err:  # no C++ compiler here, a graph the compiler refuses: reported, not fatal
        return Line(
            "torch.compile same output",
            first_line(err, 120),
            False,
            False,
        )
    return Line("torch.compile same output", f"max difference {diff:.2g}", diff <= 1e-4, False)


def speed_line(name: str) -> Line:
    """Forward+backward time against LayerNorm's native op at two widths: the norm benchmark's ratio.

    The 1.1x goal holds normbench's own norms, whose fused kernels were written to meet it; a user's
    norm in eager PyTorch ops runs several times LayerNorm's single fused op (so does F.rms_norm on a
    CPU), and its ratio is reported, not flagged: it is what the norm costs a sweep, not a fault."""
    df = timing._run(
        torch.device("cpu"),
        ["fp32"],
        list(WIDTHS),
        4096,
        [name],
        repeats=5,
        compile=False,
        console=Console(stderr=True, quiet=True),
    )
    rows = df[(df.impl == "normbench") & (df["pass"] == "fwd+bwd")]
    ratios = {int(r.dim): float(r.ratio_to_ln) for r in rows.itertuples()}
    figure = ", ".join(f"{r:.2f}x at {d}" for d, r in ratios.items())
    if not is_builtin(norm_class(name)):
        return Line(SPEED_NAME, f"{figure} (no goal for your own norm)", None, False)
    return Line(
        SPEED_NAME,
        f"{figure} (goal {SPEED_GOAL}x)",
        max(ratios.values()) <= SPEED_GOAL,
        False,
    )


def model_lines(run) -> list[Line]:
    """The lines of a model with this norm and placement: causality, gradients, compile."""
    torch.manual_seed(run.seed)
    vocab = 64
    model = GPT(run.model, vocab, run.norm, run.placement)
    tokens = torch.randint(vocab, (4, run.model.block_size), generator=torch.Generator().manual_seed(3))
    lines = []
    for mode, train_mode in (("train", True), ("eval", False)):
        leak = causal_leak(model, tokens, vocab, train_mode)
        lines.append(
            Line(f"no future leak ({mode} mode)", f"max logit change {leak:.2g}", leak <= 1e-5, True)
        )
    model.train()
    lines.append(_gradient_line(model, lambda: model(tokens)[0]))
    lines[-1].name = "gradients reach every parameter (model)"
    return lines


def unigram_entropy(run) -> float:
    """The entropy (nats) of the token frequencies of the validation targets a run is evaluated on:
    the loss of the best prediction that ignores the context."""
    from normbench.data.corpus import build_dataset

    tcfg = run.train
    data = build_dataset(run.data, run.model.block_size, tcfg.eval_batches * tcfg.batch_size)
    targets = torch.cat([y.flatten() for _, y in data.val_batches(tcfg.eval_batches, tcfg.batch_size)])
    return corpus.unigram_entropy(targets, data.vocab_size)


def learn_line(overrides: list[str], steps: int) -> Line:
    """A short model=micro run: its validation loss must end LEARN_MARGIN below the unigram entropy of
    the corpus it trains on, which a model that ignores its context cannot pass."""
    from normbench.training.loop import train

    cfg = compose([*overrides, "model=micro", f"train.steps={steps}", "train.progress=false"])
    run = parse_config(cfg)
    with tempfile.TemporaryDirectory(prefix="normbench-check-") as tmp:
        summary = train(run, Path(tmp), console=Console(stderr=True, quiet=True))
        evals = [json.loads(r) for r in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    start = next(r["val_loss"] for r in evals if r.get("kind") == "eval")
    final, unigram = summary.get("final_val_loss"), unigram_entropy(run)
    ok = final is not None and math.isfinite(final) and final < unigram - LEARN_MARGIN
    figure = (
        f"val loss {start:.3f} -> {final if final is None else f'{final:.3f}'} in {steps} steps; "
        f"unigram entropy {unigram:.3f} (must end {LEARN_MARGIN} below)"
    )
    return Line("a model=micro run learns", figure, ok, True)


def run_check(overrides: list[str], *, compile: bool = True, speed: bool = True, steps: int | None = None):
    """The conformance table for the norm and placement these overrides choose; ``steps`` of the
    learning run (LEARN_STEPS by default)."""
    extensions.install()  # installed packages' norms and placements are config options too
    cfg = compose(overrides)
    run = parse_config(cfg)
    norm = dict(run.norm)
    name = norm.pop("name")
    lines = []
    if name != "none":
        lines += norm_lines(name, norm, run.model.d_model)
    lines += model_lines(run)
    if compile:
        probe = _randomized(build_norm(name, run.model.d_model, **norm)).eval()
        lines.append(compile_line(probe, _norm_input(run.model.d_model)))
    if speed and name != "none":
        lines.append(speed_line(name))
    lines.append(learn_line(overrides, steps or LEARN_STEPS))
    return {"norm": run.norm, "placement": run.placement, "lines": lines}


def show(result: dict, console: Console) -> None:
    table = Table(
        title=f"normbench check: norm={result['norm']['name']} placement={result['placement']['name']}"
    )
    for column in ("property", "figure", "result"):
        table.add_column(column)
    for line in result["lines"]:
        color = {"ok": "green", "FAIL": "red", "flag": "yellow"}.get(line.mark, "dim")
        table.add_row(line.name, line.figure, f"[{color}]{line.mark}[/{color}]")
    console.print(table)


def as_json(result: dict) -> str:
    return json.dumps(
        {**result, "lines": [{**asdict(line), "result": line.mark} for line in result["lines"]]}, indent=2
    )


def failed(result: dict) -> list[Line]:
    """The lines that must hold and did not."""
    return [line for line in result["lines"] if line.must and line.ok is False]

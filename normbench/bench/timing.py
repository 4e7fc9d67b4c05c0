"""Norm micro-benchmark behind ``normbench bench``: how fast is each norm of the zoo?

Owns the timing of one norm at a time, forward and forward+backward, for three
implementations of the same math: the normbench module (``normbench``), PyTorch's
own op called directly (``native``: F.layer_norm, F.rms_norm, F.group_norm,
F.batch_norm) and ``torch.compile`` of the normbench module (``compiled``, the
only reference for scale and dyt, which have no native op). Every norm's blocks are
interleaved with two references timed on the same inputs in the same rounds:
LayerNorm's native op (``ratio_to_ln``: what each norm costs against the norm it would
replace) and a plain ``clone`` of the input (``copy_gb_per_s``: the memory bandwidth a
pass over the tensor can reach here, the physical limit). ``run_bench`` returns one
pandas row per (norm, impl, dim, dtype, device, pass) and prints a rich table.
The training-throughput benchmark lives elsewhere.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import random
import statistics
import time
import timeit
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from torch import nn

from normbench.bench.goals import GOALS
from normbench.core import provenance
from normbench.core.devices import PRECISIONS, resolve_device
from normbench.core.errors import ConfigError, first_line
from normbench.core.fileio import write_atomic
from normbench.model import impls as norm_impls
from normbench.model.impls import COMPILED, EAGER, chosen
from normbench.model.norms import NORMS, build_norm

PROVENANCE = [
    "normbench",
    "commit",
    "dirty",
    "torch",
    "device_name",
    "threads",
    "precision",
    "norm_impl",
    "compile",
    "numerics",
]
DEFAULT_DIMS = [128, 256, 512, 1024, 2048, 4096, 8192]
DEFAULT_TOKENS = {"cuda": 8192, "cpu": 1024}  # CPU: a default fp32 run takes about a minute, compile included
COLUMNS = [
    "norm",
    "impl",
    "dim",
    "dtype",
    "device",
    "pass",
    "tokens",
    "ms",
    "gb_per_s",
    "copy_gb_per_s",
    "ratio_to_ln",
    "ratio_to_native",
    "ratio_to_compiled",
    # where and with what each row was measured (normbench.core.provenance); norm_impl: what the row ran
    *PROVENANCE,
]
NATIVE = ("ln", "rms", "bn", "gn")  # norms with a PyTorch op for the same math
REFERENCES = ("ref:ln", "ref:copy")  # timed in every norm's rounds, reported as columns, not rows
MAX_ROTATION = 64  # rotated input buffers at most, however small they are
ROTATION_BYTES = 1 << 30  # memory the rotated inputs may take (a quarter of free memory on CUDA)


def time_ms(
    fns,
    *,
    repeats: int = 25,
    warmup: int = 3,
    block_s: float = 2e-3,
    device: torch.device | str = "cpu",
    clock=None,
):
    """Median milliseconds per call of ``fn()``; for a dict name -> fn, a dict of medians.

    Each timed block runs a fn enough times to last about ``block_s`` (so timer and
    synchronization overhead stay small); on CUDA it ends with a synchronize. Blocks
    of the fns are interleaved, one block of each per round in a shuffled order (a b c,
    c a b, b c a ...): a slow spell on a shared machine then hits every fn alike instead
    of whichever was being timed, and no fn always follows the same one (a fixed order
    biased a measured ratio: docs/benchmarks.md#how-it-times). ``clock`` defaults to
    wall time (``time.perf_counter``).
    Standard-library ``timeit`` rather than ``torch.utils.benchmark.Timer``: Timer's
    ``blocked_autorange`` picks power-of-ten block sizes, leaving sub-millisecond ops
    a few blocks to take a median of, its ``timeit`` re-warms on every call (tripling
    the cost of slow ops), and neither interleaves. ``timeit`` also pauses the GC.
    """
    device = torch.device(device)
    clock = clock or time.perf_counter
    if device.type == "cuda":

        def clock():  # kernels are asynchronous: a block ends when the device is done
            torch.cuda.synchronize(device)
            return time.perf_counter()

    named = fns if isinstance(fns, dict) else {"": fns}
    timers, numbers = {}, {}
    for name, fn in named.items():
        for _ in range(warmup):  # lazy init, allocator growth, compilation: none of it in a block
            fn()
        timers[name] = timeit.Timer(fn, timer=clock)
        numbers[name] = max(1, round(block_s / timers[name].timeit(1)))
    times = {name: [] for name in named}
    order, rng = list(timers), random.Random(0)
    for _ in range(repeats):
        # A fresh order each round: no fn always runs right after the same other one, whose
        # leftovers (caches, allocator, compiled code's state) would otherwise tax it alone.
        rng.shuffle(order)
        for name in order:
            times[name].append(timers[name].timeit(numbers[name]) / numbers[name])
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    return ms if isinstance(fns, dict) else ms[""]


def _keep_freed_memory() -> None:
    """Make glibc keep freed memory for reuse instead of returning it to the OS (CPU runs).

    Torch's CPU allocator is plain malloc, and glibc by default serves big blocks with a
    fresh mmap and trims the heap on free, so an op's outputs land on new pages and pay
    page faults and zeroing on every call, more or less at random with heap layout.
    What that cost: docs/benchmarks.md#how-it-times (CPU specifics). CUDA's caching
    allocator needs no such help.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to tune
        return
    libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: never give the heap top back
    libc.mallopt(-4, 0)  # M_MMAP_MAX: no mmap per big block; everything from the reusable heap


def _last_level_cache_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).L2_cache_size
    sizes = {}
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (index / "size").read_text().strip()  # e.g. "32768K"
            scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1], 1)
            sizes[int((index / "level").read_text())] = int(size.rstrip("KM")) * scale
        except (OSError, ValueError):
            pass
    return sizes[max(sizes)] if sizes else 32 << 20


def _rotated_inputs(tokens: int, dim: int, dtype: torch.dtype, device: torch.device):
    """An endless cycle of (x, grad_output) pairs whose x's add up to twice the last-level cache.

    A benchmark that reuses one input finds it in cache from the previous call and
    reports a bandwidth no training step sees. Every timed closure draws from this one
    shared cycle, so each call gets the least recently used pair: with per-closure
    cycles, whichever impl ran second in a round read inputs the first had just
    cached (what that did to a timing: docs/benchmarks.md#how-it-times).
    """
    x_bytes = tokens * dim * dtype.itemsize
    budget = ROTATION_BYTES
    if device.type == "cuda":
        budget = min(budget, torch.cuda.mem_get_info(device)[0] // 4)
    count = math.ceil(2 * _last_level_cache_bytes(device) / x_bytes)
    count = max(1, min(count, MAX_ROTATION, budget // (2 * x_bytes)))
    gen = torch.Generator(device).manual_seed(0)
    make = lambda: torch.randn(tokens, dim, dtype=dtype, device=device, generator=gen)
    return itertools.cycle([(make().requires_grad_(), make()) for _ in range(count)])


def _cast_once(params: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """Copies of the parameters in x's dtype, made once, as leaves of their own."""
    return [p.detach().to(dtype).requires_grad_() for p in params]


def _native(name: str, m: nn.Module, dtype: torch.dtype):
    """PyTorch's op for the same math on the module's own tensors: (fn, grad leaves)."""
    if name in ("ln", "gn"):
        # The CPU kernels take float32 parameters with half inputs; the CUDA ones want x's dtype.
        w, b = (m.weight, m.bias) if m.weight.device.type == "cpu" else _cast_once([m.weight, m.bias], dtype)
        if name == "ln":
            return (lambda x: F.layer_norm(x, w.shape, w, b, m.eps)), [t for t in (w, b) if t is not None]
        return (lambda x: F.group_norm(x, m.groups, w, b, m.eps)), [w, b]
    if name == "rms":
        # Weight cast once to x's dtype: a mixed-dtype call takes rms_norm's slow unfused path.
        [w] = _cast_once([m.weight], dtype)
        return (lambda x: F.rms_norm(x, w.shape, w, m.eps)), [w]
    if name == "bn":
        bn = m.bn
        return (
            lambda x: F.batch_norm(
                x, bn.running_mean, bn.running_var, bn.weight, bn.bias, True, bn.momentum, bn.eps
            )
        ), list(m.parameters())
    raise KeyError(name)


def _compile(m: nn.Module, x: torch.Tensor, dy: torch.Tensor):
    # Static shapes give the compiler its best shot at each width; resetting drops the
    # graphs of earlier widths so dynamo never hits its recompile limit and falls back to eager.
    torch.compiler.reset()
    fn = torch.compile(m, dynamic=False)
    torch.autograd.backward(fn(x), dy)  # compile forward and backward now, outside any timing
    x.grad = None
    m.zero_grad(set_to_none=True)
    return fn


def _references(inputs, dim: int, dtype: torch.dtype, device: torch.device) -> dict:
    """LayerNorm's native op (both passes) and a clone of the input: the yardsticks of every row."""
    fn, leaves = _native("ln", build_norm("ln", dim).to(device), dtype)
    steps = {("ref:ln", p): step for p, step in _passes(fn, leaves, inputs).items()}
    steps[("ref:copy", "fwd")] = lambda: next(inputs)[0].detach().clone()
    return steps


def _passes(fn, leaves: list[torch.Tensor], inputs):
    """The two timed closures, each taking the next pre-allocated pair on every call."""

    def fwd():  # the training forward: autograd records, as inside a training step
        fn(next(inputs)[0])

    def fwd_bwd():
        x, dy = next(inputs)
        torch.autograd.backward(fn(x), dy)
        # None, not zero_(): no memset kernel, and no accumulate kernel in the next backward.
        x.grad = None
        for t in leaves:
            t.grad = None

    return {"fwd": fwd, "fwd+bwd": fwd_bwd}


def _check(device, dtypes, dims, tokens, norms, repeats, threads) -> torch.device:
    dev = resolve_device(device, key="device")
    for what, given, allowed in (("dtype", dtypes, PRECISIONS), ("norm", norms, NORMS)):
        bad = [g for g in given if g not in allowed]
        if bad or not given:
            raise ConfigError(
                f"unknown {what} {', '.join(map(repr, bad)) or '(none given)'}", allowed=sorted(allowed)
            )
    if not dims or any(not isinstance(d, int) or d <= 0 for d in dims):
        raise ConfigError(f"dims must be positive integers, got {dims}", allowed=["e.g. 128 256 1024"])
    for what, value in (("tokens", tokens), ("repeats", repeats), ("threads", threads)):
        if value is not None and value < 1:
            raise ConfigError(f"{what} must be >= 1, got {value}")
    for name in norms:  # a width a norm can't take (gn's groups) fails now, not ten minutes in
        for dim in dims:
            build_norm(name, dim)
        chosen(name, dev)  # the fused CPU kernels built now (once per machine), never inside a timing
    return dev


def run_bench(
    device: str = "cpu",
    dtypes: list[str] = ("fp32",),
    dims: list[int] | None = None,
    tokens: int | None = None,
    norms: list[str] | None = None,
    repeats: int = 25,
    compile: bool = True,
    threads: int | None = 1,
    out: Path | None = None,
    console: Console | None = None,
) -> pd.DataFrame:
    """Time every requested norm, width and dtype; return (and optionally write) the rows.

    ``tokens`` defaults to 8192 on CUDA and 1024 on CPU. ``repeats`` is the number of
    timed blocks each median is taken over (see ``time_ms``). ``threads`` is torch's
    CPU thread count during the run (None: leave it), 1 by default as in
    ``torch.utils.benchmark``: comparable across machines and safe from
    oversubscription (see docs/benchmarks.md#how-it-times);
    with 1 thread, CPU ms are the thread's CPU time, not wall time (see ``_run``).
    ``none`` is timed as a floor: the harness's own cost (module call, autograd
    bookkeeping, dx = dy copy) with no norm.
    Parameters stay fp32 whatever the dtype, as under mixed precision in training.

    ``gb_per_s`` counts each full-size tensor once: fwd moves x in and y out, fwd+bwd
    also dy in and dx out, so bytes = (2 or 4) * tokens * dim * element size;
    parameters, their grads and saved statistics are O(dim + tokens) and left out.
    ``copy_gb_per_s`` is the same count for ``x.clone()`` (x in, copy out) timed in the
    same rounds: gb_per_s / copy_gb_per_s is how close a row is to the memory limit.
    ``ratio_to_ln`` divides ms by LayerNorm's native op (``F.layer_norm``) on the same
    inputs, timed in the same rounds (so on ln's own native row it is the run's noise,
    not 1 by construction). ``ratio_to_native`` / ``ratio_to_compiled`` divide ms by the
    native / compiled ms of the same norm, dim, dtype and pass (NaN where that impl
    wasn't measured).
    """
    dims = DEFAULT_DIMS if dims is None else list(dims)
    norms = list(NORMS) if norms is None else [norms] if isinstance(norms, str) else list(norms)
    dtypes = [dtypes] if isinstance(dtypes, str) else list(dtypes)
    dev = _check(device, dtypes, dims, tokens, norms, repeats, threads)
    tokens = tokens or DEFAULT_TOKENS[dev.type]
    console = console or Console()
    if dev.type == "cpu":
        _keep_freed_memory()
    norm_impls.use("auto")  # what a run binds by default, whatever an earlier run in this process chose
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads or saved_threads)
    try:
        df = _run(dev, dtypes, dims, tokens, norms, repeats, compile, console)
    finally:
        torch.set_num_threads(saved_threads)
    if out is not None:
        write_csv(df, Path(out))
    show(df, console)
    console.print(
        f"wrote {out} ({len(df)} rows; compare bench files with: normbench report {out})"
        if out is not None
        else "not saved: --out FILE.csv writes these rows",
        highlight=False,
        soft_wrap=True,
    )
    return df


def _run(dev, dtypes, dims, tokens, norms, repeats, compile, console) -> pd.DataFrame:
    # One CPU thread does all the work (ATen, autograd and the compiled kernels, generated
    # for torch's thread count), so its CPU time is the op's time minus any time other
    # processes held the core: reproducible on a shared machine, where wall time is not.
    clock = time.thread_time if dev.type == "cpu" and torch.get_num_threads() == 1 else None
    rows = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("bench", total=len(dtypes) * len(dims) * len(norms))
        for dtype_name, dim in itertools.product(dtypes, dims):
            dtype = PRECISIONS[dtype_name]
            inputs = _rotated_inputs(tokens, dim, dtype, dev)
            for name in norms:
                progress.update(task, description=f"{name} {dim} {dtype_name}")
                m = build_norm(name, dim).to(dev)
                impls = {"normbench": (m, list(m.parameters()))}
                if name in NATIVE:
                    impls["native"] = _native(name, m, dtype)
                if compile and name != "none":
                    try:
                        impls["compiled"] = (_compile(m, *next(inputs)), list(m.parameters()))
                    except Exception as e:  # no C++ compiler, unsupported platform, compiler bug
                        console.print(f"[yellow]compiled skipped from here on: {first_line(e, 160)}")
                        compile = False
                steps = {
                    (impl, p): step
                    for impl, (fn, leaves) in impls.items()
                    for p, step in _passes(fn, leaves, inputs).items()
                }
                steps.update(_references(inputs, dim, dtype, dev))
                timed = time_ms(steps, repeats=repeats, device=dev, clock=clock)
                full = tokens * dim * dtype.itemsize  # bytes of one full-size tensor
                copy_gb_per_s = 2 * full / timed[("ref:copy", "fwd")] / 1e6
                for (impl, pass_), ms in timed.items():
                    if impl in REFERENCES:
                        continue
                    moved = (2 if pass_ == "fwd" else 4) * full
                    rows.append(
                        {
                            "norm": name,
                            "impl": impl,
                            "dim": dim,
                            "dtype": dtype_name,
                            "device": str(dev),
                            "pass": pass_,
                            "tokens": tokens,
                            "ms": ms,
                            "gb_per_s": math.nan if name == "none" else moved / ms / 1e6,
                            "copy_gb_per_s": copy_gb_per_s,
                            "ratio_to_ln": ms / timed[("ref:ln", pass_)],
                        }
                    )
                progress.advance(task)
            del inputs

    df = pd.DataFrame(rows)
    key = ["norm", "dim", "dtype", "device", "pass"]
    for ref in ("native", "compiled"):
        base = df[df.impl == ref].set_index(key).ms.rename("ref")
        df[f"ratio_to_{ref}"] = df.ms / df.join(base, on=key)["ref"]
    return _with_provenance(df, dev).reindex(columns=COLUMNS)


def _with_provenance(df: pd.DataFrame, dev: torch.device) -> pd.DataFrame:
    """Each row's provenance, as a run's summary has it: the code, torch, the device by name and the
    thread count (while the bench's are set), and the implementation the row ran: the normbench module's
    own choice (normbench.model.impls), PyTorch's op (eager) or torch.compile (compiled)."""
    block = provenance.collect(dev, "", {}, "off")
    for key in PROVENANCE:
        df[key] = [block[key]] * len(df)
    df["precision"] = df["dtype"]
    ran = {"native": EAGER, "compiled": COMPILED}
    df["norm_impl"] = [ran.get(impl) or chosen(norm, dev) for norm, impl in zip(df.norm, df.impl)]
    df["compile"] = ["on" if impl == "compiled" else "off" for impl in df.impl]
    return df


def write_csv(df: pd.DataFrame, out: Path) -> None:
    """Write atomically: a reader (or a crash) never sees half a file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, df.to_csv(index=False))


def goals(df: pd.DataFrame) -> pd.DataFrame:
    """Per norm and dtype: the worst normbench ratio to its reference over widths and passes."""
    rows = []
    for (name, dtype), g in df[df.impl == "normbench"].groupby(["norm", "dtype"], sort=False):
        if name not in GOALS:
            continue
        ref, limit = GOALS[name]
        ratios = g[f"ratio_to_{ref}"]
        if ratios.isna().all():
            continue
        worst = g.loc[ratios.idxmax()]
        rows.append(
            dict(
                norm=name,
                dtype=dtype,
                reference=ref,
                goal=limit,
                worst=ratios.max(),
                at=f"{worst.dim} {worst['pass']}",
                met=bool(ratios.max() <= limit),
            )
        )
    return pd.DataFrame(rows, columns=["norm", "dtype", "reference", "goal", "worst", "at", "met"])


def show(df: pd.DataFrame, console: Console) -> None:
    """One line per (dtype, norm, dim, pass): ms of each impl and normbench's ratios and bandwidth."""
    index = ["device", "dtype", "norm", "dim", "pass"]
    ms = df.pivot_table(index=index, columns="impl", values="ms", sort=False)
    nb = df[df.impl == "normbench"].set_index(index)
    impls = [i for i in ("native", "normbench", "compiled") if i in ms.columns]
    table = Table(
        title=f"norm micro-benchmark, {df.tokens.iloc[0]} tokens (ms, median; "
        "x ln: normbench / F.layer_norm in the same rounds; % copy: GB/s / a clone's GB/s)"
    )
    for col in [
        "device",
        "dtype",
        "norm",
        "dim",
        "pass",
        *impls,
        "x ln",
        "x native",
        "x compiled",
        "GB/s",
        "% copy",
    ]:
        table.add_column(col, justify="right" if col not in ("device", "dtype", "norm", "pass") else "left")
    fmt = lambda v, f: "" if pd.isna(v) else format(v, f)
    for key, r in ms.iterrows():
        row = nb.loc[key]
        device, dtype, name, dim, pass_ = key
        table.add_row(
            device,
            dtype,
            name,
            str(dim),
            pass_,
            *[fmt(r.get(i), ".4f") for i in impls],
            fmt(row.ratio_to_ln, ".2f"),
            fmt(row.ratio_to_native, ".2f"),
            fmt(row.ratio_to_compiled, ".2f"),
            fmt(row.gb_per_s, ".1f"),
            fmt(100 * row.gb_per_s / row.copy_gb_per_s, ".0f"),
        )
    console.print(table)
    g = goals(df)
    for r in g.itertuples():
        mark = "[green]met" if r.met else "[red]missed"
        console.print(
            f"{r.norm} {r.dtype}: worst {r.worst:.2f}x {r.reference} at {r.at} (goal {r.goal}x) {mark}"
        )

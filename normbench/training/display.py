"""What a person sees of one run on the terminal: what its set-up chose, the progress bar while it
trains and the closing table.

Kept apart from the training loop, which only hands them what it built and numbers.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text


def say_setup(console: Console, state) -> None:
    """What a training ``Run``'s set-up chose that changes what it computes or how fast, said once: the
    model compiled by default on CUDA, a compiler that fell back to eager, and a norm that reads the
    batch trained in micro-batches (accumulation changes no other norm's run)."""
    # here, not at the module's top: a sweep's planning process imports this module and never torch
    from normbench.model import norms
    from normbench.training import distributed

    run = state.cfg
    main, share = distributed.is_main(), distributed.local_batch_size(run.train.batch_size)
    if state.compiled and run.train.compile == "cuda" and main:
        console.print("train.compile: compiled on CUDA (train.compile=false trains eagerly)", highlight=False)
    by_batch = norms.batch_norms(state.model) if (run.train.micro_batch_size or share) < share else []
    if by_batch and main:
        console.print(
            f"{', '.join(by_batch)}: batch statistics per micro-batch of {run.train.micro_batch_size} "
            f"sequences (train.micro_batch_size), not per batch of {share}",
            highlight=False,
        )
    if state.compile_error:
        console.print(
            f"[yellow]train.compile: torch.compile is not usable here ({state.compile_error}); training "
            "eagerly[/yellow]",
            soft_wrap=True,
        )


class TrainProgress:
    """The training bar: steps done, the last window's loss, tokens/s and gradient norm."""

    def __init__(self, console: Console, enabled: bool, total: int, completed: int):
        self.bar = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[tps]} tok/s"),
            TextColumn("|g| {task.fields[gnorm]}"),
            TimeRemainingColumn(),
            console=console,
            disable=not enabled,
            transient=False,
        )
        self.task = self.bar.add_task("train", total=total, completed=completed, loss="-", tps="-", gnorm="-")

    def __enter__(self) -> TrainProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def update(self, record: dict) -> None:
        """A train record (normbench.training.loop's log window) moves the bar."""
        self.bar.update(
            self.task,
            completed=record["step"],
            loss=f"{record['train_loss']:.3f}",
            tps=f"{record['tokens_per_s']:,.0f}",
            gnorm=f"{record['grad_norm']:.2f}",
        )


def summary_table(summary: dict, run_dir: Path | str) -> Group:
    """The closing table a person reads after a run; under it, where the run is (``run_dir``)."""
    table = Table(title=f"run {summary['status']}", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")

    def fmt(v, spec=".4f"):
        return "-" if v is None else format(v, spec)

    table.add_row("final val loss", fmt(summary["final_val_loss"]))
    table.add_row("best val loss", fmt(summary["best_val_loss"]))
    if summary.get("final_val_bpb") is not None or summary.get("best_val_bpb") is not None:
        table.add_row(
            "val bits per byte final / best",
            f"{fmt(summary.get('final_val_bpb'))} / {fmt(summary.get('best_val_bpb'))}",
        )
    if summary["floor_loss"] is not None:
        table.add_row("floor (Bayes-optimal)", fmt(summary["floor_loss"]))
        if summary["final_val_loss"] is not None:
            table.add_row("gap to floor", fmt(summary["final_val_loss"] - summary["floor_loss"]))
    table.add_row(
        "tokens/s steps / wall clock",
        f"{fmt(summary['tokens_per_s'], ',.0f')} / {fmt(summary.get('wall_tokens_per_s'), ',.0f')}",
    )
    table.add_row(
        "step time p50 / p90",
        f"{fmt(summary['step_ms_p50'], '.1f')} / {fmt(summary['step_ms_p90'], '.1f')} ms",
    )
    if summary["mfu"] is not None:
        peak = summary.get("peak_flops")
        unit, scale = ("TFLOP/s", 1e12) if peak and peak >= 1e12 else ("GFLOP/s", 1e9)
        of = f" of {peak / scale:.3g} {unit}, {summary['peak_flops_source']}" if peak else ""
        table.add_row("MFU", f"{100 * summary['mfu']:.1f}%{of}")
    table.add_row("peak memory", f"{fmt(summary['peak_mem_mb'], ',.0f')} MB")
    table.add_row(
        "max grad norm / clipped",
        f"{fmt(summary['max_grad_norm'], '.3g')} / {100 * summary['clip_fraction']:.0f}% of steps",
    )
    table.add_row("wall time", f"{summary['wall_s']:.1f} s")
    table.add_row("parameters", f"{summary['params']:,}")
    if recipe := summary.get("recipe"):  # the model's init and head, and whether the placement's own
        own = recipe["placement_own"]
        mine = {key: recipe[key] for key in own}
        said = "the placement's own" if mine == own else f"set; the placement's own: {_recipe_words(own)}"
        table.add_row("init", f"{_recipe_words(mine)} ({said})")
    norm_impl = summary.get("provenance", {}).get("norm_impl")
    if norm_impl:  # which implementation computed these figures (normbench.model.impls)
        table.add_row("norms", ", ".join(f"{kind}: {how}" for kind, how in norm_impl.items()))
    leak = summary["causal_leak"]
    if leak["train"] is not None:
        flag = " [red](leaks the future in train mode)[/red]" if summary["leaks_future"] else ""
        table.add_row("causal leak train / eval", f"{leak['train']:.1e} / {leak['eval']:.1e}{flag}")
    if summary["error"]:
        table.add_row("error", Text(summary["error"]))  # the error's own words, never markup
    # one line however long the path: a person copies it
    return Group(table, Text(f"run directory: {run_dir}", no_wrap=True, overflow="ignore"))


def _recipe_words(recipe: dict) -> str:
    return f"{recipe['init']}, head {'tied' if recipe['tie_head'] else 'untied'}"

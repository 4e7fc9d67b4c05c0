"""The ``normbench`` command line: a thin Typer layer over the library.

``train`` and ``sweep`` hand their arguments to Hydra untouched (override syntax,
``--cfg job``, ``hydra.run.dir=...``); the other commands call library functions. The options
that every command composing a config shares (``--config-dir``) are declared once here. A user's
mistake is a ConfigError wherever it is found, said in one line with exit 2 at the app's edge
(``MistakeEdge``, through ``normbench.core.errors.edge``); a mistake Hydra finds becomes one
(``normbench.core.errors.composition_error``).
"""

from __future__ import annotations

import gc
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path

import typer
from typer.core import TyperCommand, TyperGroup

import normbench
from normbench.claims.cli import app as claims_app
from normbench.core.configtree import (  # not normbench.training.config, which imports torch
    added_options,
    group_options,
)
from normbench.core.errors import ConfigError, edge

HYDRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}
GROUPS = "{groups}"  # where a command's help lists the config groups' options (GroupsHelp)

# The options every command that composes a config takes, declared once.
CONFIG_DIR = typer.Option(
    None,
    "--config-dir",
    help="Your config folder (conf/norm/*.yaml, conf/placement/*.yaml, ...), added to Hydra's search path.",
)


def _groups_help(config_dir: Path | None = None) -> str:
    lines = []
    for g in ("norm", "placement", "model", "data", "train", "logger"):
        added = added_options(g, config_dir)
        lines.append(
            f"  {g:<10} {', '.join(group_options(g))}" + (f"; yours: {', '.join(added)}" if added else "")
        )
    return "\n".join(lines)


class GroupsHelp(TyperCommand):
    """A command whose help lists each config group's options, with those that installed packages and
    the --config-dir on the command line add: the text is made when help is asked for."""

    def parse_args(self, ctx, args):
        ctx.meta["normbench.args"] = list(args)  # --help is handled while parsing: before the options are
        return super().parse_args(ctx, args)

    def format_help(self, ctx, formatter):
        template = self.help
        self.help = template.replace(GROUPS, _groups_help(_config_dir_in(ctx.meta.get("normbench.args", []))))
        try:
            return super().format_help(ctx, formatter)
        finally:
            self.help = template


def _config_dir_in(args: list[str]) -> Path | None:
    for i, arg in enumerate(args):
        if arg == "--config-dir" and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--config-dir="):
            return Path(arg.split("=", 1)[1])
    return None


class MistakeEdge(TyperGroup):
    """The app's edge: a ConfigError raised anywhere under a command (the ``claims`` commands too) is
    its one line, ``error: ...``, and exit 2, with no traceback."""

    def invoke(self, ctx):
        return edge(lambda: super(MistakeEdge, self).invoke(ctx), _say_error)


def _say_error(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)


app = typer.Typer(
    cls=MistakeEdge,
    help=(
        "normbench: normalization ablations (LayerNorm, RMSNorm, BatchNorm, ... ; pre, post, ...) in mini "
        "GPTs."
    ),
    no_args_is_help=True,
    rich_markup_mode="rich",
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"normbench {normbench.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_version, help="Print normbench's version and exit."
    ),
) -> None:
    """Train, sweep, report and benchmark normalization ablations."""


app.add_typer(claims_app, name="claims")


def _hydra(args: list[str]) -> None:
    # imported late: Hydra is slow to import and --help needs none of it
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from normbench.core.errors import composition_error
    from normbench.sweeps.job import hydra_main
    from normbench.training import distributed

    # Hydra raises its errors rather than printing them with its search path: said here in one line.
    full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        if distributed.is_main():
            sys.argv = ["normbench", *args]
            hydra_main()
            return
        # Under torchrun, Hydra would create a run directory (.hydra/, a log) in every process, and its
        # ${now:...} name can differ between ranks by a second. Rank 0 owns the real one; the others get
        # a private scratch directory (last override wins) that is deleted when they finish.
        with tempfile.TemporaryDirectory(prefix=f"normbench-rank{distributed.rank()}-") as scratch:
            sys.argv = ["normbench", *args, f"hydra.run.dir={scratch}", f"hydra.sweep.dir={scratch}"]
            hydra_main()
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(composition_error(err)) from None
    finally:
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error


@app.command(
    cls=GroupsHelp,
    context_settings=HYDRA_ARGS,
    help=f"""Train one mini GPT. Arguments are Hydra overrides.

[bold]Config groups[/bold] (choose one with GROUP=OPTION):

{GROUPS}

Any key can be set: model.n_layer=6 train.lr=3e-3 norm.eps=1e-6 seed=1.
Show the composed config with [bold]--cfg job[/bold]; choose the run directory with hydra.run.dir=DIR.

[bold]Examples[/bold]

  normbench train norm=rms placement=pre

  normbench train norm=bn placement=post train.steps=500 seed=1

  normbench train data=text data.path=input.txt model=small

  normbench train --config-dir myconf norm=maxnorm
""",
)
def train(ctx: typer.Context, config_dir: Path | None = CONFIG_DIR) -> None:
    from normbench.training import distributed  # torch: train loads it next anyway

    grid = [a for a in ctx.args if a in ("-m", "--multirun")]
    if grid and not distributed.launched():  # under torchrun the job says what to do instead
        # the same overrides, less the single run's directory
        rest = [a for a in ctx.args if a not in grid and not a.startswith("hydra.run.dir=")]
        raise ConfigError(
            f"train runs one configuration: run a grid with {shlex.join(['normbench', 'sweep', *rest])}"
        )
    _hydra(_with_config_dir(ctx.args, config_dir))


@app.command(
    cls=GroupsHelp,
    context_settings=HYDRA_ARGS,
    help=f"""Run a grid of trainings: Hydra's multirun, resumable. Arguments are Hydra overrides.

A comma list, range(a,b[,step]) or glob(...) sweeps a key; every combination is one run with
its own run directory under the sweep directory (results/sweeps/NAME-HASH unless
hydra.sweep.dir=DIR is given). Running the same command again resumes: runs completed with the
same config are kept, interrupted ones run again, diverged and failed ones are kept unless
--retry-failed. The exit code is 1 if any run failed (diverging is a result, not a failure).

[bold]Config groups[/bold] (sweep a group with GROUP=A,B or "GROUP=glob(*)"):

{GROUPS}

[bold]Named experiments[/bold] (experiment=NAME): {", ".join(group_options("experiment"))}

[bold]Launchers[/bold]: by default one run at a time, in a warm worker process; hydra.launcher.n_jobs=N
runs N at once on this machine (each gets cpus // N torch threads); hydra/launcher=slurm (SLURM, one GPU
per job; pip install 'normbench\\[slurm]'), hydra/launcher=ray_cluster (Ray; pip install
'normbench\\[ray]'). See docs/sweeps.md.

[bold]Examples[/bold]

  normbench sweep norm=ln,rms,bn,gn placement=pre,post seed=0,1,2

  normbench sweep experiment=norm_zoo hydra.launcher.n_jobs=2

  normbench sweep --dry-run experiment=warmup train.steps=2000

  normbench sweep norm=ln,rms seed="range(0,5)" model=small hydra/launcher=slurm hydra.launcher.partition=gpu
""",
)
def sweep(
    ctx: typer.Context,
    config_dir: Path | None = CONFIG_DIR,
    dry_run: bool = typer.Option(
        False, "--dry-run", help="List the runs the sweep would make, and which already have results."
    ),
    retry_failed: bool = typer.Option(
        False, "--retry-failed", help="Run again the runs that diverged or failed."
    ),
    batch_seeds: bool = typer.Option(
        False,
        "--batch-seeds",
        help="Train each config's seeds together as one batched model (what cannot runs one at a time).",
    ),
) -> None:
    from normbench.model import extensions
    from normbench.sweeps import batching, multirun

    _refuse_options(
        ctx.args,
        "sweep",
        "--config-dir, --dry-run, --retry-failed, --batch-seeds and Hydra overrides KEY=VALUE "
        "(to see a run's config: normbench train --cfg job KEY=VALUE ...)",
    )
    args = _with_config_dir(ctx.args, config_dir) + ([batching.OPTION] if batch_seeds else [])
    # Started before normbench.sweeps.sweep (and PyTorch) is imported: it warms up while this process plans.
    child = None if dry_run else multirun.start(args, retry_failed)
    extensions.install()  # installed packages' norms and placements, for the plan's composition
    from normbench.sweeps.sweep import run_sweep

    raise typer.Exit(run_sweep(args, dry_run=dry_run, retry_failed=retry_failed, child=child))


def _refuse_options(args: list[str], command: str, usage: str) -> None:
    """Hydra overrides pass through Typer untouched; an unknown --option among them is a mistake."""
    flags = [a for a in args if a.startswith("-")]
    if flags:
        raise ConfigError(f"unknown option {flags[0]}: {command} takes {usage}")


@app.command()
def report(
    paths: list[Path] = typer.Argument(
        None, help="Run or sweep directories (searched recursively) and bench CSV files. Default: results/"
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output folder. Default: a report/ folder beside the runs."
    ),
    group_by: str | None = typer.Option(
        None, "--group-by", help="Comma-separated config keys to group by. Default: the keys that vary."
    ),
    metric: str = typer.Option(
        "final_val_loss",
        "--metric",
        help=(
            "The summary metric the verdict is about: ranking, best learning rate, intervals, vs best, "
            "sensitivity (final_val_loss, final_val_bpb, best_val_loss, floor_gap, tokens_per_s, ...)."
        ),
    ),
    formats: str = typer.Option("png", "--format", help="Chart formats, comma-separated: png, svg, pdf."),
    tune: str | None = typer.Option(
        None,
        "--tune",
        help=(
            "Compare each configuration at its best value of this key, with its sensitivity to it. Default: "
            "train.lr when it varies; 'none' turns it off."
        ),
    ),
    scale: str | None = typer.Option(
        None,
        "--scale",
        help=(
            "The size axis (model.d_model, model.n_layer, train.steps, ...): each comparison across sizes, "
            "its trend, the best value's drift. Default: the one size key that varies; 'none' turns it off."
        ),
    ),
    baseline: str | None = typer.Option(
        None,
        "--baseline",
        help=(
            "The configuration compared with across sizes, e.g. norm=ln,placement=pre. Default: the best at "
            "the largest size."
        ),
    ),
    allow_mixed: bool = typer.Option(
        False,
        "--allow-mixed",
        help="Compare runs of different numerics versions (refused otherwise: not the same computation).",
    ),
    width: int | None = typer.Option(
        None,
        "--width",
        min=40,
        help="Terminal width for the tables. Default: the terminal's; the tables' own width when piped.",
    ),
    predict: str | None = typer.Option(
        None,
        "--predict",
        help=(
            "Sizes to predict at, comma-separated, in parameters (tokens for a token key): each "
            "configuration's L = E + A x^-alpha fit, its loss and gap there with 95% intervals, and a "
            "backtest on the largest size. Needs --scale."
        ),
    ),
    where: list[str] = typer.Option(
        None,
        "--where",
        help="Read only the runs whose config has KEY=VALUE (a dotted key, e.g. norm.name=ln); repeatable.",
    ),
    exclude: list[str] = typer.Option(
        None,
        "--exclude",
        help="Leave out the runs whose config has KEY=VALUE (train.lr=0.03); repeatable.",
    ),
) -> None:
    """Verdicts, tables (CSV, Markdown, terminal) and charts (PNG/SVG/PDF, one HTML page) comparing runs."""
    from normbench.core.terminal import terminal_console
    from normbench.report import run_report

    run_report(
        paths or [Path("results")],
        out=out,
        group_by=group_by.split(",") if group_by else None,
        metric=metric,
        formats=tuple(f.strip() for f in formats.split(",") if f.strip()),
        tune_key=tune,
        scale_key=scale,
        baseline=baseline,
        predict=predict,
        console=terminal_console(width),
        allow_mixed=allow_mixed,
        where=where or [],
        exclude=exclude or [],
    )


@app.command()
def bench(
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    dtype: str = typer.Option("fp32", "--dtype", help="Comma-separated: fp32, bf16, fp16."),
    dims: str | None = typer.Option(None, "--dims", help="Comma-separated widths. Default: 128 to 8192."),
    tokens: int | None = typer.Option(
        None, "--tokens", help="Tokens per call (rows of the (tokens, dim) input)."
    ),
    norms: str | None = typer.Option(None, "--norms", help="Comma-separated norms. Default: the whole zoo."),
    compile: bool = typer.Option(True, "--compile/--no-compile", help="Also time torch.compile'd versions."),
    repeats: int = typer.Option(25, "--repeats", help="Timed blocks per median; more on a noisy machine."),
    threads: int = typer.Option(
        1, "--threads", help="CPU threads while timing (1: CPU time of one thread, the default)."
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the results as CSV here."),
) -> None:
    """Micro-benchmark every norm (forward, forward+backward) against PyTorch's native op."""
    from normbench.bench.timing import run_bench

    try:
        widths = [int(d) for d in dims.split(",")] if dims else None
    except ValueError as err:
        raise ConfigError(f"--dims takes integers, e.g. 128,1024 ({err})") from None
    run_bench(
        device=device,
        dtypes=[d.strip() for d in dtype.split(",")],
        dims=widths,
        tokens=tokens,
        norms=norms.split(",") if norms else None,
        repeats=repeats,
        compile=compile,
        threads=threads,
        out=out,
    )


@app.command(
    context_settings=HYDRA_ARGS,
    help="""Coordinate check: each width trained a few Adam steps at train.lr; the RMS of each block's output.

Arguments besides the options are Hydra overrides of the config every width shares (model.n_head
stays fixed, head_dim grows). Writes OUT/coordcheck.csv (param, width, step, layer, rms) and
OUT/coordcheck.png. Under μP (model.param=mup) the curves stay flat across widths; under SP they grow.

[bold]Example[/bold]

  normbench coordcheck model=micro train.lr=1e-2 --widths 32,64,128,256 --steps 3 --out coordcheck
""",
)
def coordcheck(
    ctx: typer.Context,
    config_dir: Path | None = CONFIG_DIR,
    widths: str = typer.Option("32,64,128,256", "--widths", help="Comma-separated d_model values."),
    steps: int = typer.Option(3, "--steps", help="Adam steps after init (step 0)."),
    param: str = typer.Option("both", "--param", help="sp, mup or both (side by side)."),
    out: Path = typer.Option(Path("coordcheck"), "--out", "-o", help="Output folder."),
) -> None:
    from normbench.coordcheck import run_coordcheck

    _refuse_options(
        ctx.args,
        "coordcheck",
        "--config-dir, --widths, --steps, --param, --out and Hydra overrides KEY=VALUE",
    )
    run_coordcheck(_with_config_dir(ctx.args, config_dir), widths, steps, param, out)


@app.command()
def prepare(
    sources: list[str] = typer.Argument(
        ...,
        help="Text files, folders, globs, .jsonl/.parquet files, a datasets save_to_disk folder, a hub name.",
    ),
    tokenizer: str = typer.Option(
        ..., "--tokenizer", "-t", help="char, byte, bpe:N (trained here), a tokenizer.json, tiktoken:NAME."
    ),
    out: Path = typer.Option(
        Path("data"),
        "--out",
        "-o",
        help="Parent folder: the shards go into OUT/NAME-HASH/, named by content.",
    ),
    val: list[str] = typer.Option(
        [],
        "--val",
        help="A separate validation source (repeatable); default: every 1/val-fraction-th document.",
    ),
    val_fraction: float = typer.Option(0.1, "--val-fraction", help="The share of documents held out."),
    column: str = typer.Option("text", "--column", help="The text column of JSONL, Parquet and datasets."),
    split_on_blank_lines: bool = typer.Option(
        False, "--split-on-blank-lines", help="One document per blank-line-separated paragraph, not per file."
    ),
    shard_tokens: int = typer.Option(100_000_000, "--shard-tokens", help="Tokens per shard at most."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (uint16 below 65,536 tokens), uint16 or uint32."),
) -> None:
    """Tokenize text into llm.c token shards for data=tokens data.path=DIR (docs/data.md)."""
    from normbench.core.errors import DiskFull
    from normbench.data.prepare import Options
    from normbench.data.prepare import prepare as run_prepare

    opts = Options(
        sources=sources,
        tokenizer=tokenizer,
        val=val,
        val_fraction=val_fraction,
        column=column,
        split_on_blank_lines=split_on_blank_lines,
        shard_tokens=shard_tokens,
        dtype=dtype,
    )
    try:
        folder = run_prepare(opts, out)
    except DiskFull as err:
        raise ConfigError(f"{err}; nothing was kept: free space and run it again") from None
    typer.echo(f"train on it: normbench train data=tokens data.path={folder}")


def _with_config_dir(args: list[str], config_dir: Path | None) -> list[str]:
    """--config-dir as Hydra's search path: the user's conf/norm/*.yaml beside normbench's."""
    if config_dir is None:
        return list(args)
    if not config_dir.is_dir():
        raise ConfigError(f"--config-dir {config_dir}: no such folder")
    path = str(config_dir.resolve())
    # A plain path as a plain value: the printed resume command then needs one pair of shell quotes
    # (for the brackets), not quotes inside quotes; only a path Hydra's grammar cannot take bare is quoted.
    if re.fullmatch(r"[\w/.:+-]+", path):
        value = f"file://{path}"
    else:
        value = "'file://" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"
    # Beside the user's own overrides: Hydra's parser takes the overrides as one run of arguments, so one
    # after its flags (model=wee --cfg job hydra.searchpath=...) would be refused.
    overrides = [i + 1 for i, arg in enumerate(args) if "=" in arg and not arg.startswith("-")]
    at = max(overrides, default=len(args))
    return [*args[:at], f"hydra.searchpath=[{value}]", *args[at:]]


@app.command(
    cls=GroupsHelp,
    context_settings=HYDRA_ARGS,
    help=f"""Check a norm or placement, built-in or your own, before a sweep trusts it.

One line per property with its figure: output shape and finite values, the output's dtype (fp32,
bf16, fp16 inputs), float32 statistics under bf16, no future leak (train and eval mode), the declared
statistics kept, gradients to every parameter, a state-dict round trip, torch.compile,
forward+backward time against LayerNorm (normbench's own norms: the norm benchmark's 1.1x goal;
yours: the figure), and a short model=micro run
that learns. Exit 1 when a property without which results are wrong fails (a wrong shape or a
non-finite output, a leak, other statistics than declared, a dead parameter, not learning); the
others are flagged with their cost, exit 0. Arguments are Hydra overrides.

[bold]Config groups[/bold]:

{GROUPS}

[bold]Examples[/bold]

  normbench check norm=rms

  normbench check --config-dir myconf norm=maxnorm placement=pre --json
""",
)
def check(
    ctx: typer.Context,
    config_dir: Path | None = CONFIG_DIR,
    as_json: bool = typer.Option(False, "--json", help="Print the lines as JSON, for scripts."),
    compile: bool = typer.Option(True, "--compile/--no-compile", help="Include the torch.compile line."),
    speed: bool = typer.Option(True, "--speed/--no-speed", help="Include the timing line."),
    steps: int | None = typer.Option(
        None, "--steps", help="Steps of the model=micro run that must learn. Default: 150."
    ),
) -> None:
    from rich.console import Console

    from normbench.extending import conformance

    _refuse_options(
        ctx.args,
        "check",
        "--config-dir, --json, --no-compile, --no-speed, --steps and KEY=VALUE",
    )
    overrides = _with_config_dir(ctx.args, config_dir)
    result = conformance.run_check(overrides, compile=compile, speed=speed, steps=steps)
    if as_json:
        print(conformance.as_json(result))
    else:
        conformance.show(result, Console())
    raise typer.Exit(1 if conformance.failed(result) else 0)


@app.command()
def new(
    kind: str = typer.Argument(..., help="norm or placement."),
    name: str = typer.Argument(..., help="Its name in configs: norm=NAME, placement=NAME."),
    folder: Path = typer.Option(Path("."), "--dir", help="Where to write the module, its YAML and its test."),
) -> None:
    """Write a starting norm or placement (module, conf/ YAML, a test running normbench check) that passes."""
    from normbench.extending import scaffold

    for path in scaffold.write(kind, name, folder):
        typer.echo(f"wrote {path}")
    typer.echo(f"try it: cd {folder} && PYTHONPATH=. normbench check --config-dir conf {kind}={name}")


def main() -> None:
    try:
        app()
    finally:
        # The work is done: spare the garbage collector its last passes over all that PyTorch
        # allocated at import (a third of a second at exit); finalizers and atexit handlers still run.
        gc.freeze()


if __name__ == "__main__":
    main()

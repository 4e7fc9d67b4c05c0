"""The ``normbench`` command line: a thin Typer layer over the library.

``train`` and ``sweep`` hand their arguments to Hydra untouched (override syntax,
``--cfg job``, ``hydra.run.dir=...``); the other commands call library functions.
"""

from __future__ import annotations

import sys

import typer

from normbench.config import group_options

HYDRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def _groups_help() -> str:
    lines = [f"  {g:<10} {', '.join(group_options(g))}" for g in ("norm", "placement", "model", "data", "train")]
    return "\n".join(lines)


app = typer.Typer(
    help="normbench: normalization ablations (LayerNorm, RMSNorm, BatchNorm, ... ; pre, post, ...) in mini GPTs.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Train, sweep, report and benchmark normalization ablations."""


def _hydra(args: list[str]) -> None:
    from normbench.app import hydra_main  # imported late: Hydra is slow to import and --help needs none of it

    sys.argv = ["normbench", *args]
    hydra_main()


@app.command(
    context_settings=HYDRA_ARGS,
    help=f"""Train one mini GPT. Arguments are Hydra overrides.

[bold]Config groups[/bold] (choose one with GROUP=OPTION):

{_groups_help()}

Any key can be set: model.n_layer=6 train.lr=3e-3 norm.eps=1e-6 seed=1.
Show the composed config with [bold]--cfg job[/bold]; choose the run directory with hydra.run.dir=DIR.

[bold]Examples[/bold]

  normbench train norm=rms placement=pre

  normbench train norm=bn placement=post train.steps=500 seed=1

  normbench train data=text data.path=input.txt model=small
""",
)
def train(ctx: typer.Context) -> None:
    _hydra(ctx.args)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

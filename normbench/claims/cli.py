"""``normbench claims``: list the registry, run claims, report their verdicts, check a claim's YAML.

Typer only at import (``normbench --help`` stays fast); the sweeps and the report load when a
command needs them.
"""

from __future__ import annotations

from pathlib import Path

import typer

HYDRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}
# The published registry (its run records and verdicts, committed) and every verb's default folder
# (normbench.claims.families says why one folder serves every verb).
PUBLISHED = Path("results/claims")
LOCAL = Path("results/claims-local")
OUT = typer.Option(
    LOCAL,
    "--out",
    "-o",
    help="The claims' folder, one for every verb: each claim's runs in OUT/ID/, its pre-registration "
    f"and confirmation in OUT/confirmations/ID/. {PUBLISHED} is the published registry's (normbench's "
    "own claims, from a clean commit); your claims never write there.",
)
JOIN = typer.Option(
    False,
    "--join-registry",
    help="Correct your claims (--config-dir) in one Holm family with the registry's; by default they "
    "are a family of their own, and the registry's verdicts are not corrected for them.",
)
CONFIG_DIR = typer.Option(
    None,
    "--config-dir",
    help="Your config folder: its claim/*.yaml join the registry (and experiment/, norm/...). Given "
    "before the verb (normbench claims --config-dir DIR run ID) or after it: one meaning.",
)

app = typer.Typer(
    help=(
        "The claims registry: every headline claim about normalization as an experiment with a verdict. "
        "Alone, it lists the claims (id, source, the claim, the model size it runs at, its sweep's cost)."
    ),
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)


@app.callback(invoke_without_command=True)
def claims(ctx: typer.Context, config_dir: Path | None = CONFIG_DIR) -> None:
    """List the claims (id, source, the claim, its model size, its sweep's cost); the subcommands run and
    judge them."""
    ctx.obj = config_dir  # the verbs read it (_config_dir): one option, before any verb
    if ctx.invoked_subcommand is not None:
        return
    from rich.table import Table

    from normbench.claims.schema import load_registry
    from normbench.core.terminal import terminal_console

    registry = load_registry(config_dir)
    table = Table(title=f"{len(registry)} claims", title_justify="left")
    table.add_column("id", no_wrap=True)
    table.add_column("source", min_width=14)
    table.add_column("claim", min_width=30)
    table.add_column("predicate", no_wrap=True)
    table.add_column("scale", no_wrap=True)
    table.add_column("cost", no_wrap=True)
    for c in registry:
        runs = c.runs()
        cost = f"{runs} runs" + (f", {c.cost_s:.0f} s" if c.cost_s else "")
        table.add_row(c.id, c.cites, c.claim, c.kind, c.scale["model"], cost)
    terminal_console().print(table)


def _config_dir(ctx: typer.Context, given: Path | None) -> Path | None:
    """The verb's --config-dir, else the one given before the verb; two different ones are an error."""
    from normbench.core.errors import ConfigError

    before = ctx.parent.obj if ctx.parent is not None else None
    if given is not None and before is not None and Path(given).resolve() != Path(before).resolve():
        raise ConfigError(f"--config-dir given twice ({before}, {given}): give one config folder")
    return given if given is not None else before


@app.command(
    context_settings=HYDRA_ARGS,
    help="""Run claims' sweeps, each into OUT/ID/ (resumable), through normbench sweep's machinery.

Arguments are claim ids and Hydra overrides (KEY=VALUE), which replace the claim's own value of
the key in every sweep: train.steps=50 shortens the runs, hydra.launcher.n_jobs=2 runs two at once.
Running the same command again keeps finished runs and resumes interrupted ones. It ends with the
claims' verdicts: the rows normbench claims report writes for them.

[bold]Examples[/bold]

  normbench claims run rms_matches_ln_quality

  normbench claims run --all model=mini hydra.launcher.n_jobs=2
""",
)
def run(
    ctx: typer.Context,
    all_claims: bool = typer.Option(False, "--all", help="Every claim of the registry."),
    out: Path = OUT,
    config_dir: Path | None = CONFIG_DIR,
    join: bool = JOIN,
    retry_failed: bool = typer.Option(
        False, "--retry-failed", help="Run again the runs that diverged or failed."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="List each claim's runs and which have results."),
    batch_seeds: bool | None = typer.Option(
        None,
        "--batch-seeds/--no-batch-seeds",
        help="Train each config's seeds together as one batched model (sweep --batch-seeds). "
        "Default: on where the runs train on a CUDA device, off on a CPU.",
        show_default=False,
    ),
) -> None:
    from normbench.claims.families import check_folder
    from normbench.claims.running import run_claims
    from normbench.claims.schema import load_registry, select
    from normbench.core.errors import ConfigError

    flags = [a for a in ctx.args if a.startswith("-")]
    if flags:
        raise ConfigError(
            f"unknown option {flags[0]}: claims run takes --all, --out, --config-dir, --join-registry, "
            "--retry-failed, --dry-run, --batch-seeds/--no-batch-seeds, claim ids and KEY=VALUE"
        )
    ids = [a for a in ctx.args if "=" not in a]
    overrides = [a for a in ctx.args if "=" in a]
    config_dir = _config_dir(ctx, config_dir)
    registry = load_registry(config_dir)
    if not ids and not all_claims:
        raise ConfigError("name the claims to run (normbench claims lists them), or --all")
    chosen = registry if all_claims else select(registry, ids)
    check_folder(chosen, out)
    code = run_claims(chosen, overrides, out, config_dir, retry_failed, dry_run, batch_seeds=batch_seeds)
    if not dry_run and code != 130:
        _show_verdicts(registry, chosen, out, join, pilot=True)
    raise typer.Exit(code)


def _assess(registry: list, folders: list[Path], holm: bool, join: bool, warn=lambda m: None) -> list:
    """Every claim's verdict from ``folders``, Holm-corrected within its family (the registry's, or the
    user's own: normbench.claims.families), in registry order."""
    from normbench.claims.families import families
    from normbench.claims.verdicts import assess_all

    judged = {}
    for family in families(registry, join):
        others = [c for c in registry if c not in family]
        judged.update((v.claim.id, v) for v in assess_all(family, folders, holm, warn, others=others))
    return [judged[c.id] for c in registry]


def _show_verdicts(registry: list, chosen: list, folder: Path, join: bool, pilot: bool = False) -> None:
    """The verdicts of the claims just run, as claims report judges them from ``folder`` (Holm-corrected
    within each claim's family), its rows for these claims only, then a line each in words; with
    ``pilot``, what the confirmation of a claim not yet pre-registered needs. Nothing is written."""
    from normbench.claims import output
    from normbench.claims.families import family_of
    from normbench.claims.telling import next_step, verdict_line
    from normbench.core.terminal import terminal_console

    console = terminal_console()
    ids = {c.id for c in chosen}
    verdicts = [v for v in _assess(registry, [folder], True, join) if v.claim.id in ids]
    output.show(output.rows(verdicts, folder), console)
    for v in verdicts:
        console.print(verdict_line(v), soft_wrap=True, highlight=False)
        if pilot and (step := next_step(v, folder, len(family_of(v.claim, registry, join)))):
            console.print(step, soft_wrap=True, highlight=False)


@app.command()
def report(
    ctx: typer.Context,
    paths: list[Path] = typer.Argument(
        None,
        help=f"Folders holding the claims' runs (ID/ below). Default: {LOCAL}; {PUBLISHED} recomputes "
        "the published verdicts from their committed records.",
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output folder. Default: the first folder given."
    ),
    holm: bool = typer.Option(
        True,
        "--holm/--no-holm",
        help="Holm-correct the verdicts and intervals across the claims run (the default).",
    ),
    config_dir: Path | None = CONFIG_DIR,
    join: bool = JOIN,
    markdown: Path | None = typer.Option(
        None,
        "--markdown",
        help="Print the Markdown page (claims.md) of this claims.csv, and nothing else.",
    ),
    reports: bool = typer.Option(
        False, "--reports", help="Also write each claim's own report (normbench report ID/ into ID/report/)."
    ),
    headline: bool = typer.Option(
        False, "--headline", help="With --markdown: only the headline and its table (the README's)."
    ),
) -> None:
    """Every claim's verdict: claims.csv, claims.md, claims.html and this table (claims not run say so)."""
    from normbench.claims import output
    from normbench.claims.schema import load_registry
    from normbench.core.errors import ConfigError
    from normbench.core.terminal import terminal_console

    if markdown is not None:
        frame = output.read_csv(markdown)
        typer.echo(output.headline_table(frame) if headline else output.markdown(frame), nl=False)
        return
    paths = paths or [LOCAL]
    for path in paths:
        if not path.is_dir() and path != LOCAL:
            raise ConfigError(f"{path}: no such folder (the claims' runs: normbench claims run ID)")
    paths = [p for p in paths if p.is_dir()]
    registry = load_registry(_config_dir(ctx, config_dir))
    console = terminal_console()
    verdicts = _assess(
        registry, paths, holm, join, warn=lambda m: console.print(f"[yellow]warning[/yellow] {m}")
    )
    if reports:
        _claim_reports(verdicts, console)
    target = out or (paths[0] if paths else LOCAL)
    published = target.resolve() == PUBLISHED.resolve()  # the registry's own folder: its README too
    frame = output.write(verdicts, target, PUBLISHED / "claims.csv", with_readme=published)
    output.show(frame, console)
    console.print(f"wrote {target / 'claims.csv'}, claims.md, claims.html", highlight=False)


def _claim_reports(verdicts: list, console) -> None:
    """normbench report ID/ into ID/report/ for each claim judged, its output kept off the terminal. A
    claim without a finished run, or with runs of other numerics beside its current ones (which the
    report would refuse to mix), gets a warning instead: one claim's report must not cost the others'."""
    import io

    from rich.console import Console

    from normbench.report import run_report

    for v in verdicts:
        if v.folder is None:
            continue
        why = v.outcome.reason if v.word == "not run" else ""
        if v.stale and not why:
            why = f"{v.stale} run(s) of other numerics (normbench claims run {v.claim.id} retrains them)"
        if why:
            console.print(f"[yellow]warning[/yellow] no report for {v.folder}: {why}", highlight=False)
        else:
            run_report([v.folder], out=v.folder / "report", console=Console(file=io.StringIO()))


@app.command()
def preregister(
    ctx: typer.Context,
    claim_id: str = typer.Argument(..., help="The claim to pre-register."),
    out: Path = OUT,
    config_dir: Path | None = CONFIG_DIR,
    join: bool = JOIN,
) -> None:
    """Fix a claim's confirmation from its pilot (its runs in OUT/ID/): each arm's value, the seeds for
    80% power at its level in its family (yours, or the registry's), the test and its direction, into
    OUT/confirmations/ID/prereg.yaml; then the confirmation's estimated time, and the verdict so far."""
    from normbench.claims.confirming import preregister as write
    from normbench.claims.families import check_folder, family_of
    from normbench.claims.schema import load_registry, select

    claims = load_registry(_config_dir(ctx, config_dir))
    claim = select(claims, [claim_id])[0]
    check_folder([claim], out)
    typer.echo(write(claim, out, len(family_of(claim, claims, join))))
    _show_verdicts(claims, [claim], out, join)


@app.command(context_settings=HYDRA_ARGS)
def confirm(
    ctx: typer.Context,
    claim_id: str = typer.Argument(..., help="A pre-registered claim."),
    out: Path = OUT,
    config_dir: Path | None = CONFIG_DIR,
    join: bool = JOIN,
    dry_run: bool = typer.Option(False, "--dry-run", help="List the confirmation's runs."),
) -> None:
    """Run a claim's pre-registered confirmation (fresh seeds, each arm at its fixed value) into
    OUT/confirmations/ID/, resumable, its estimated time said first and its verdict last; Hydra overrides
    (hydra.launcher.n_jobs=2) may follow."""
    from normbench.claims.confirming import confirm as run_confirmation
    from normbench.claims.families import check_folder
    from normbench.claims.schema import load_registry, select

    claims = load_registry(_config_dir(ctx, config_dir))
    claim = select(claims, [claim_id])[0]
    check_folder([claim], out)
    code = run_confirmation(claim, out, list(ctx.args), dry_run=dry_run)
    if not dry_run and code != 130:
        _show_verdicts(claims, [claim], out, join)
    raise typer.Exit(code)


@app.command()
def check(path: Path = typer.Argument(..., help="A claim YAML (CONFIG_DIR/claim/ID.yaml).")) -> None:
    """Validate a claim: its YAML, then its sweep composed (every job) with its arms, tuned key and scale
    found in it, then whether its design can decide at the level the registry's family gives it. One
    line naming what is wrong, exit 2; or what it claims."""
    from normbench.claims import rules
    from normbench.claims.checking import check_claim, check_design
    from normbench.claims.schema import at_larger_size, parse_claim
    from normbench.core.errors import ConfigError

    claim = parse_claim(path)
    checked = check_claim(claim)
    check_design(claim, PUBLISHED)
    rows = {claim.id: checked.sweep}
    sizes = f"model={claim.scale['model']}"
    if claim.scale["larger"]:  # its row at the larger size: the same sweep composed at that size
        rows[f"{claim.id}@{claim.scale['larger']}"] = check_claim(at_larger_size(claim)).sweep
        sizes += f" and model={claim.scale['larger']}"
    # a verdict whose rule (or the sweep it composes) moved after its pilot began decides nothing
    for row, sweep in rows.items():
        if rules.changed(PUBLISHED / row, claim.path, sweep):
            raise ConfigError(
                f"{path}: its rule or the sweep it composes changed after the pilot of {row} began "
                f"({PUBLISHED / row / rules.FILE}): that verdict cannot be published; pilot it again on "
                "fresh seeds"
            )
    typer.echo(
        f"ok: {claim.id} ({claim.cites}): {claim.kind}, {checked.jobs} runs in its default sweep, at {sizes}"
    )

"""Running a claim: its sweep into one stable directory, DIR/<id>/, through ``normbench sweep``.

The sweep's overrides are the claim's (its experiment, then its overrides), then the user's (a key
the user names replaces the claim's value of it: train.steps=3 shortens every run), then
``hydra.sweep.dir=DIR/<id>``. So running the same claim again resumes it: finished runs are kept,
interrupted ones continue from their checkpoints (normbench.sweeps.sweep.run_sweep). The claim's
YAML is copied beside its runs (claim.yaml), the definition its verdict was measured against, and
the rule its pilot runs under with the commits that fixed and ran it (rule.yaml, normbench.claims.rules), and
every set of the user's own overrides it was run with is recorded (overrides.yaml), so a verdict
from runs that differ from the registry's sweep says how. Before any claim runs, each one's sweep is
composed with the user's overrides and checked (normbench.claims.checking): a mistyped key or an arm
no job matches stops the command there. A run another claim has trained, of the same config and after
this claim's rule was fixed, is copied in rather than trained again (normbench.claims.sharing).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from rich.console import Console

from normbench.claims import rules
from normbench.claims.checking import claim_args, override_key, shape_of
from normbench.claims.schema import Claim
from normbench.core.errors import ConfigError
from normbench.core.fileio import leaves, write_atomic
from normbench.core.runs import CONFIG, SUMMARY

_LOADER = getattr(
    yaml, "CSafeLoader", yaml.SafeLoader
)  # the C loader where PyYAML has it: hundreds of configs

FINISHED = ("completed", "diverged")  # a run's stored result a sweep keeps (a failed one too, unless retried)


def sweep_args(claim: Claim, overrides: list[str], out: Path, config_dir: Path | None = None) -> list[str]:
    """The Hydra overrides of ``normbench sweep`` for this claim."""
    if "hydra.sweep.dir" in {override_key(o) for o in overrides}:
        raise ConfigError("claims run chooses each claim's sweep directory", allowed=["--out DIR"])
    return [*claim_args(claim, overrides, config_dir), f"hydra.sweep.dir={(out / claim.id).resolve()}"]


OVERRIDES = "overrides.yaml"


def recorded_overrides(folder: Path) -> list[list[str]]:
    """Every set of a user's overrides the claim's runs in ``folder`` were made with ([] for none)."""
    try:
        sets = yaml.safe_load((folder / OVERRIDES).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return []
    return [list(map(str, s)) for s in sets if isinstance(s, list)] if isinstance(sets, list) else []


def sweep_changed(claim: Claim, folder: Path) -> bool:
    """Whether the runs in ``folder`` are of another sweep than the claim's now (the claim.yaml
    ``claims run`` copied beside them says which they ran)."""
    try:
        then = yaml.safe_load((folder / "claim.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return False
    now = yaml.safe_load(claim.path.read_text(encoding="utf-8"))
    return isinstance(then, dict) and then.get("sweep") != now.get("sweep")


def record_overrides(folder: Path, overrides: list[str]) -> None:
    """Add this run's overrides (the registry's own sweep: none) to the folder's record. Hydra's own
    (hydra.launcher.n_jobs=2, a search path) choose how the sweep runs, not what it computes: not recorded
    (the threads a run had are in its provenance)."""
    overrides = [o for o in overrides if not override_key(o).startswith("hydra.")]
    sets = recorded_overrides(folder)
    if overrides and overrides not in sets:
        write_atomic(folder / OVERRIDES, yaml.safe_dump([*sets, list(overrides)]))


def _summaries(folder: Path) -> list[dict]:
    """The summary.json of each run directly below ``folder``."""
    found = []
    for path in sorted(folder.glob(f"*/{SUMMARY}")) if folder.is_dir() else []:
        try:
            body = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(body, dict):
            found.append(body)
    return found


def seconds_per_run(
    claim: Claim, *folders: Path, shapes: tuple[tuple, ...] = (), records: list[Path] = ()
) -> tuple[float | None, str]:
    """(a run's seconds, where the figure comes from): the mean wall time of the finished runs in the
    first of ``folders`` that has any (measured on this machine), else the claim's cost_s over its
    default sweep's runs (measured on a 2-core CPU), else the mean over its jobs' ``shapes`` of the
    wall time of finished runs of the same shape in the claims' folders ``records``, else (None, why)."""
    for folder in folders:
        walls = [float(s["wall_s"]) for s in _summaries(folder) if isinstance(s.get("wall_s"), (int, float))]
        if walls:
            return sum(walls) / len(walls), f"the mean of its {len(walls)} finished run(s) in {folder}"
    if claim.cost_s:
        return claim.cost_s / claim.runs(), "the claim's cost_s, measured on a 2-core CPU"
    by_shape = _walls_by_shape(records) if shapes else {}
    if shapes and all(by_shape.get(s) for s in shapes):
        per_job = [sum(by_shape[s]) / len(by_shape[s]) for s in shapes]
        counted = sum(len(by_shape[s]) for s in set(shapes))
        where = ", ".join(str(r) for r in records)
        return sum(per_job) / len(per_job), f"{counted} finished runs of the same size and steps in {where}"
    return None, f"no finished run to time and no cost_s in {claim.path}"


def _walls_by_shape(records: list[Path]) -> dict[tuple, list[float]]:
    """The wall times of the completed runs in claims' folders (``records``: each claim's ID/ and
    confirmations/ID/), by the runs' shape (normbench.claims.checking.shape_of)."""
    walls: dict[tuple, list[float]] = {}
    for root in records:
        for path in [*root.glob(f"*/*/{SUMMARY}"), *root.glob(f"confirmations/*/*/{SUMMARY}")]:
            try:
                summary = json.loads(path.read_text(encoding="utf-8"))
                config = yaml.load((path.parent / CONFIG).read_text(encoding="utf-8"), Loader=_LOADER)
            except (OSError, ValueError, yaml.YAMLError):
                continue
            if (
                not (isinstance(summary, dict) and isinstance(config, dict))
                or summary.get("status") != "completed"
            ):
                continue
            if isinstance(wall := summary.get("wall_s"), (int, float)):
                walls.setdefault(shape_of(leaves(config, lists="json")), []).append(float(wall))
    return walls


def duration(seconds: float) -> str:
    """'40 s', '12 min', '3.5 h'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def estimate(runs: int, per_run: float | None, source: str) -> str:
    """'12 runs to run, about 4 min (20 s a run: SOURCE), one after another' or why no time is known."""
    todo = f"{runs} run{'s' if runs != 1 else ''} to run"
    if per_run is None:
        return f"{todo}; time not known yet ({source}): the sweep times them as they finish"
    return f"{todo}, about {duration(runs * per_run)} one after another ({per_run:.3g} s a run: {source})"


def runs_to_go(claim: Claim, overrides: list[str], folder: Path, retry_failed: bool) -> int:
    """The claim's runs with these overrides, less those whose results the folder holds already."""
    keep = FINISHED if retry_failed else (*FINISHED, "failed")
    held = sum(1 for s in _summaries(folder) if s.get("status") in keep)
    swept = [o for o in overrides if not override_key(o).startswith("hydra.")]
    return max(claim.runs(swept) - held, 0)


def _sources(claim: Claim, out: Path) -> list[Path]:
    """The claims' folders whose runs this claim may share or be timed by: those beside it in ``out``
    and, for the registry's own claims, the registry's published records."""
    from normbench.claims.families import PUBLISHED, is_users

    return [out, *([PUBLISHED] if not is_users(claim) and PUBLISHED.resolve() != out.resolve() else [])]


def _borrow(claim: Claim, args: list[str], folder: Path, out: Path, console: Console) -> None:
    """The runs other claims have trained that this claim's sweep would (normbench.claims.sharing)."""
    from normbench.claims import sharing

    lent = sharing.lend(claim.path, args, folder, _sources(claim, out))
    if lent:
        said = ", ".join(f"{n} from {name}" for name, n in lent.items())
        console.print(
            f"{claim.id}: {sum(lent.values())} runs shared, not trained again ({said})", highlight=False
        )


def run_claims(
    claims: list[Claim],
    overrides: list[str],
    out: Path,
    config_dir: Path | None = None,
    retry_failed: bool = False,
    dry_run: bool = False,
    console: Console | None = None,
    batch_seeds: bool | None = None,
) -> int:
    """Run each claim's sweep in turn; the exit code: the first non-zero one (130: Ctrl-C stops them all).
    ``batch_seeds``: each sweep trains each config's seeds as one batched model (sweep --batch-seeds);
    None: where the runs train on a CUDA device (``batching.pays``)."""
    from normbench.claims.checking import check_claim
    from normbench.model import extensions
    from normbench.sweeps import batching
    from normbench.sweeps.sweep import run_sweep

    console = console or Console()
    extensions.install()  # installed packages' norms and placements, for the plan's composition
    # every claim's sweep composed and its comparison found in it, before any run
    composed = {claim.id: check_claim(claim, overrides, config_dir) for claim in claims}
    if batch_seeds is None:
        batch_seeds = batching.pays(overrides)
    worst = 0
    for claim in claims:
        args = sweep_args(claim, overrides, out, config_dir) + ([batching.OPTION] if batch_seeds else [])
        console.print(f"[bold]{claim.id}[/bold]: {claim.claim}", soft_wrap=True, highlight=False)
        folder = out / claim.id
        if not dry_run:
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(claim.path, folder / "claim.yaml")
            rules.record(folder, claim.path, composed[claim.id].sweep)
            record_overrides(folder, overrides)
            _borrow(claim, args, folder, out, console)
        todo = runs_to_go(claim, overrides, folder, retry_failed)
        timed = seconds_per_run(claim, folder, shapes=composed[claim.id].shapes, records=_sources(claim, out))
        console.print(f"{claim.id}: {estimate(todo, *timed)}", highlight=False)
        code = run_sweep(args, dry_run=dry_run, retry_failed=retry_failed, console=console)
        if code == 130:
            return code
        worst = worst or code
    return worst

"""A user's own claim from idea to verdict, in their own folder: ``claims run``, ``preregister`` and
``confirm`` read and write one folder (--out, one default), judge the user's claims as a family of
their own, say their estimated time before they start and their verdict when they end, and leave
normbench's checkout untouched."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import yaml
from conftest import REPO, run_cli
from planted import plant, t_interval, write_claim
from typer.testing import CliRunner

from normbench.claims import power, prereg
from normbench.claims.schema import load_registry
from normbench.cli import app

LOCAL = "results/claims-local"


def users_claim(conf, **body):
    """A user's claim: their norm (rms, a) better than ln (b), tuned over train.lr."""
    path = write_claim(conf, "mine", kind="better", a={"norm": "rms"}, b={"norm": "ln"}, tune="train.lr")
    stored = yaml.safe_load(path.read_text())
    stored.update(body)
    path.write_text(yaml.safe_dump(stored, sort_keys=False))
    return path


def checkout_state() -> tuple:
    """What a command could have written into normbench's checkout: its untracked files, and every file
    of results/ with its size and time (the published registry's above all)."""
    untracked = subprocess.run(
        ["git", "ls-files", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, text=True
    ).stdout
    results = sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in (REPO / "results").rglob("*"))
    return untracked, results


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_preregister_finds_the_pilot_claims_run_wrote_at_the_users_own_familys_level(tmp_path, monkeypatch):
    """The pilot in results/claims-local/mine (where claims run puts it by default): preregister, with
    --config-dir before the verb, plans from it at level 0.05, the family of the user's one claim, and
    says the confirmation's time and the verdict so far. Joining the registry's family plans at the
    level of the registry's claims and this one: more seeds."""
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "conf"
    users_claim(conf)
    for seed, (la, lb) in enumerate(zip([2.30, 2.33, 2.29], [2.00, 2.01, 2.02])):
        plant(tmp_path / LOCAL / "mine", f"rms_s{seed}", seed=seed, final=la, norm="rms")
        plant(tmp_path / LOCAL / "mine", f"ln_s{seed}", seed=seed, final=lb, norm="ln")
    result = CliRunner().invoke(app, ["claims", "--config-dir", str(conf), "preregister", "mine"])
    assert result.exit_code == 0, result.output
    design = prereg.read(tmp_path / LOCAL, "mine")
    assert design.level == pytest.approx(0.05) and design.family == 1
    said = one_line(result.output)
    assert "level 0.05 (Holm across 1)" in said
    runs = 2 * design.planned_n  # one rate: each seed's two arms
    assert f"its confirmation: {runs} runs to run; time not known yet" in said
    assert f"normbench claims --config-dir {conf} confirm mine" in said
    assert "mine: inconclusive: final_val_loss: a - b" in said and "its confirmation has not run" in said

    family = len(load_registry()) + 1
    joined = CliRunner().invoke(
        app, ["claims", "--config-dir", str(conf), "preregister", "mine", "--join-registry"]
    )
    assert joined.exit_code == 0, joined.output
    assert prereg.read(tmp_path / LOCAL, "mine").level == pytest.approx(0.05 / family)
    assert f"(Holm across {family})" in one_line(joined.output)


def test_a_confirmation_over_the_budget_is_planned_with_a_warning_that_gives_its_time(tmp_path, monkeypatch):
    """A noisy pilot needs more seeds than the budget: the design is written all the same, and a
    warning says the runs and minutes (at the claim's cost_s: 600 s over its 6 runs, 100 s a run)."""
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "conf"
    users_claim(conf, cost_s=600.0)
    for seed, (la, lb) in enumerate(zip([1.90, 2.02, 1.95], [2.00, 2.01, 2.02])):
        plant(tmp_path / LOCAL / "mine", f"rms_s{seed}", seed=seed, final=la, norm="rms")
        plant(tmp_path / LOCAL / "mine", f"ln_s{seed}", seed=seed, final=lb, norm="ln")
    d = np.subtract([1.90, 2.02, 1.95], [2.00, 2.01, 2.02])
    n, _ = power.planned_seeds(abs(d.mean()), float(np.std(d, ddof=1)), 2, 0.05)
    assert 2 * n * 100 > power.BUDGET_S  # by hand: over the hour at 100 s a run
    result = CliRunner().invoke(app, ["claims", "--config-dir", str(conf), "preregister", "mine"])
    assert result.exit_code == 0, result.output
    assert prereg.read(tmp_path / LOCAL, "mine").planned_n == n
    over = f"{2 * n} runs, about {2 * n * 100 / 60:.0f} min at 100 s a run: over the budget of 60 min"
    assert f"warning: {over}" in one_line(result.output)


def test_a_users_claim_never_writes_into_the_published_registry(tmp_path):
    conf = tmp_path / "conf"
    users_claim(conf)
    published = str(REPO / "results" / "claims")
    for verb in ("run", "preregister", "confirm"):
        result = CliRunner().invoke(
            app, ["claims", "--config-dir", str(conf), verb, "mine", "--out", published]
        )
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
        assert "holds normbench's published registry; your claim mine writes to a folder of your own" in (
            result.output
        )


def write_result(run_dir, final) -> None:
    """Replace a trained run's result by a planted one: ``final``, or None for a run that diverged."""
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    summary.update(status="completed" if final is not None else "diverged", final_val_loss=final)
    path.write_text(json.dumps(summary))


def plant_results(folder, losses) -> None:
    """``losses(norm, lr, seed)`` for each trained run below ``folder``."""
    for run_dir in sorted(p for p in folder.iterdir() if (p / "summary.json").is_file()):
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        write_result(run_dir, losses(cfg["norm"]["name"], float(cfg["train"]["lr"]), int(cfg["seed"])))


TINY = [
    "model=tiny",
    "norm=ln,rms",
    "train.lr=0.001,0.003,0.01",
    "seed=0,1,2",
    "train.steps=2",
    "train.eval_every=1",
    "train.batch_size=4",
    "train.eval_batches=1",
    "data.train_sequences=64",
    "data.val_sequences=16",
    "train.progress=false",
    "train.threads=1",
]
LN = {0.001: [2.30] * 3, 0.003: [2.00, 2.01, 2.02], 0.01: [2.20] * 3}
# worse than ln at every seed and rate; seed 0 diverged at 0.01, the rate its other seeds did best at
RMS = {0.001: [2.80] * 3, 0.003: [2.50, 2.52, 2.48], 0.01: [None, 2.30, 2.31]}


def pilot_losses(norm, lr, seed):
    return (RMS if norm == "rms" else LN)[lr][seed]


@pytest.mark.slow  # normbench claims run and confirm: sweeps' job processes
def test_a_users_claim_from_pilot_to_verdict_in_their_own_folder(tmp_path):
    """Every seed and rate of rms worse than ln's; one seed of rms diverged at a rate its other seeds
    did best at. The pilot (claims run) reads rms worse, its interval excluding 0, and says what the
    confirmation needs; preregister and confirm run in the user's folder at the user's family's level
    (one claim: 0.05) and end with the verdict; normbench's checkout is untouched."""
    before = checkout_state()
    conf = tmp_path / "conf"
    body = yaml.safe_load(users_claim(conf).read_text())
    body["sweep"]["overrides"] = TINY
    body["scale"]["model"] = "tiny"
    (conf / "claim" / "mine.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    claims = ["claims", "--config-dir", str(conf)]

    first = run_cli(*claims, "run", "mine", cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "mine: 18 runs to run; time not known yet" in one_line(first.stdout)
    pilot = tmp_path / LOCAL / "mine"
    plant_results(pilot, pilot_losses)
    again = run_cli(*claims, "run", "mine", cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    said = one_line(again.stdout)
    assert "mine: 0 runs to run, about 0 s one after another" in said
    # by hand: rms at 0.003 (0.01 scores (4.x + 2.30 + 2.31) / 3 with its diverged seed at its loss at
    # init, above 0.003's 2.50), ln at 0.003: every seed's difference positive
    d = np.subtract(RMS[0.003], LN[0.003])
    low, high = t_interval(d)
    assert low > 0
    assert (
        f"mine: not reproduced: final_val_loss: a - b {d.mean():+.3g} [{low:+.3g}, {high:+.3g}] "
        "(95%, n = 3 and 3 seeds)"
    ) in said
    assert (
        "mine: its confirmation needs 3 seeds per arm for 80% power at level 0.05 (Holm across 1: your"
        in said
    )

    planned = run_cli(*claims, "preregister", "mine", cwd=tmp_path)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    design = prereg.read(tmp_path / LOCAL, "mine")
    assert (design.level, design.values) == (pytest.approx(0.05), {"a": 0.003, "b": 0.003})
    assert "level 0.05 (Holm across 1)" in one_line(planned.stdout)
    assert "mine: inconclusive" in planned.stdout  # until its confirmation runs

    confirmed = run_cli(*claims, "confirm", "mine", cwd=tmp_path, timeout=600)
    assert confirmed.returncode == 0, confirmed.stdout + confirmed.stderr
    said = one_line(confirmed.stdout)
    assert "mine: confirmation, 6 runs to run, about" in said and "mine: " in said.split("6 runs to run")[1]
    folder = prereg.folder(tmp_path / LOCAL, "mine")
    a = {1000: 2.51, 1001: 2.49, 1002: 2.53}
    b = {1000: 2.01, 1001: 2.00, 1002: 2.02}
    plant_results(folder, lambda norm, lr, seed: (a if norm == "rms" else b)[seed])
    verdict = run_cli(*claims, "confirm", "mine", cwd=tmp_path, timeout=600)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    d = np.subtract(list(a.values()), list(b.values()))
    low, high = t_interval(d, 0.90)  # one-sided at 0.05: each end of the 90% interval
    assert (
        f"mine: not reproduced: final_val_loss: a - b {d.mean():+.3g} [{low:+.3g}, {high:+.3g}] "
        "(95% one-sided, n = 3 and 3 seeds)"
    ) in one_line(verdict.stdout)
    assert checkout_state() == before

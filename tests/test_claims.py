"""The claims registry and its commands: the shipped claims, `claims check`, `claims run` and
`claims report`, and the published verdicts recomputed from their committed records."""

from __future__ import annotations

import io
import itertools
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import run_cli, train_tiny
from planted import PROVENANCE, pair, plant, t_interval, write_claim
from scipy import stats
from typer.testing import CliRunner

from normbench.claims import output
from normbench.claims.schema import ARXIV, METRIC_NAMES, load_registry, parse_claim
from normbench.claims.verdicts import assess, assess_all
from normbench.cli import app
from normbench.core import provenance
from normbench.core.configtree import conf_dir
from normbench.core.errors import ConfigError

# ------------------------------------------------------------------ verdicts: provenance, scale, Holm


def test_a_verdict_carries_provenance_and_its_scale(tmp_path):
    folder = tmp_path / "claims" / "scaled"
    older = {**PROVENANCE, "commit": "0ld0ld0", "torch": "2.12.0+cpu", "date": "2026-11-19"}
    for seed, (la, lb) in enumerate(zip([1.90, 1.98, 1.96], [2.0, 2.1, 2.05])):
        plant(folder, f"rms_s{seed}", seed=seed, final=la, norm="rms", params=120_000)
        plant(folder, f"ln_s{seed}", seed=seed, final=lb, norm="ln", params=120_000, provenance=older)
    claim = parse_claim(write_claim(tmp_path, "scaled", kind="better", a={"norm": "rms"}, b={"norm": "ln"}))
    v = assess(claim, folder)
    assert v.word == "reproduced"
    assert v.scale_note == "reproduced at 0.12M parameters; the paper's setting is 1.3B parameters"
    assert "normbench 0ld0ld0/abc1234" in v.provenance and "torch 2.12.0+cpu/2.13.0+cpu" in v.provenance
    assert "2026-11-19/2026-11-20" in v.provenance  # the summaries' own dates, the same on any clone
    assert "changed" not in v.provenance
    body = yaml.safe_load(claim.path.read_text())
    (folder / "claim.yaml").write_text(yaml.safe_dump({**body, "predicate": {"kind": "worse"}}))
    assert "changed" not in assess(claim, folder).provenance  # the comparison is read afresh
    (folder / "claim.yaml").write_text(yaml.safe_dump({**body, "sweep": {"overrides": ["seed=0,1"]}}))
    assert (
        f"the claim's sweep changed since these runs ({folder / 'claim.yaml'})"
        in assess(claim, folder).provenance
    )


def test_runs_of_other_numerics_are_left_out_and_named(tmp_path):
    """A verdict is the code's computation: runs stored before provenance (numerics 0) or by other
    numerics are not judged; all of them stale: the claim reads not run, with the command that retrains."""
    folder = tmp_path / "claims" / "stale"
    old = {**PROVENANCE, "numerics": provenance.NUMERICS - 1}
    pair(folder, [1.90, 1.98, 1.96], [2.0, 2.1, 2.05])
    plant(folder, "rms_s3", seed=3, final=9.0, norm="rms", provenance=None)
    plant(folder, "ln_s3", seed=3, final=1.0, norm="ln", provenance=old)
    claim = parse_claim(write_claim(tmp_path, "stale", kind="better", a={"norm": "rms"}, b={"norm": "ln"}))
    v = assess(claim, folder)
    assert v.word == "reproduced" and (v.outcome.n_a, v.outcome.n_b) == (3, 3)
    assert "2 run(s) of other numerics left out" in v.outcome.reason
    only_old = tmp_path / "claims2" / "stale"
    pair(only_old, [1.90, 1.98, 1.96], [2.0, 2.1, 2.05], provenance=old)
    v = assess(claim, only_old)
    assert v.word == "not run" and "normbench claims run stale retrains them" in v.outcome.reason


def test_holm_corrects_across_the_claims_run(tmp_path):
    """Three claims: clear (p < 0.05/3), marginal (0.025 < p < 0.05) and null. Uncorrected the first two
    read reproduced; Holm judges them at 0.05/3 and 0.05/2 in p order: the marginal one turns inconclusive."""
    root, b = tmp_path / "claims", [2.0, 2.1, 2.05]
    arms = {"clear": [1.90, 1.98, 1.96], "marginal": [1.95, 2.06, 1.98], "null": [2.05, 2.05, 2.06]}
    for cid, a in arms.items():
        pair(root / cid, a, b)
    claims = [
        parse_claim(write_claim(tmp_path, cid, kind="better", a={"norm": "rms"}, b={"norm": "ln"}))
        for cid in arms
    ]
    p = {cid: stats.ttest_rel(a, b).pvalue for cid, a in arms.items()}
    assert p["clear"] < 0.05 / 3 and 0.025 < p["marginal"] < 0.05
    plain = assess_all(claims, [root])
    holm = assess_all(claims, [root], holm=True)
    assert [v.word for v in plain] == ["reproduced", "reproduced", "inconclusive"]
    assert [v.word for v in holm] == ["reproduced", "inconclusive", "inconclusive"]
    assert [v.alpha for v in holm] == pytest.approx([0.05 / 3, 0.05 / 2, 0.05])
    for v, (cid, a) in zip(holm, arms.items()):
        low, high = t_interval(np.subtract(a, b), 1 - v.alpha)
        assert (v.outcome.low, v.outcome.high) == pytest.approx((low, high)), cid
    assert all(v.corrected for v in holm) and not any(v.corrected for v in plain)
    frame = output.rows(holm, tmp_path)
    assert "Holm-corrected" in output.markdown(frame) and "not corrected" in output.markdown(
        output.rows(plain, tmp_path)
    )


# ----------------------------------------------------------------------------- the registry and its commands

runner = CliRunner()


def cli(*args):
    return runner.invoke(app, list(args), env={"COLUMNS": "400"})


def test_the_registry_lists_at_least_16_claims_each_paper_with_its_arxiv_id():
    registry = load_registry()
    papers = [c for c in registry if c.source["kind"] == "paper"]
    articles = [c for c in registry if c.source["kind"] == "article"]
    assert len(registry) >= 16 and len(articles) >= 4
    assert all(ARXIV.fullmatch(str(c.source["arxiv"])) for c in papers)
    assert all(c.source["setting"] and c.source["title"] for c in registry)
    listed = cli("claims")
    assert listed.exit_code == 0, listed.output
    for c in registry:
        assert c.id in listed.output
    for c in papers:
        assert f"arXiv {c.source['arxiv']}" in listed.output


def test_every_claims_sweep_has_the_seeds_its_predicate_needs():
    for c in load_registry():
        assert c.runs() >= 2 * c.min_seeds, c.id


def test_a_users_claim_is_listed_and_reported(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no published registry here
    conf = tmp_path / "myconf"
    write_claim(conf, "my_claim", kind="better", a={"norm": "rms"}, b={"norm": "ln"})
    pair(tmp_path / "claims" / "my_claim", [1.90, 1.98, 1.96], [2.0, 2.1, 2.05])
    listed = cli("claims", "--config-dir", str(conf))
    assert (
        listed.exit_code == 0 and "my_claim" in listed.output and "Lovelace & Babbage 2020" in listed.output
    )
    (tmp_path / "claims" / "my_claim" / "claim.yaml").write_text(
        (conf / "claim" / "my_claim.yaml").read_text()
    )
    without = cli("claims", "report", str(tmp_path / "claims"))
    assert "holds the runs of claim 'my_claim', not in the registry" in " ".join(without.output.split())
    done = cli("claims", "report", str(tmp_path / "claims"), "--config-dir", str(conf))
    assert done.exit_code == 0, done.output
    frame = pd.read_csv(tmp_path / "claims" / "claims.csv")
    row = frame.set_index("id").loc["my_claim"]
    assert row["verdict"] == "reproduced" and (row["n_a"], row["n_b"]) == (3, 3)
    assert row["scale"] == "mini, 0.001M parameters"  # the claim's model, and its runs' parameter count
    assert frame.set_index("id").loc["norm_vs_none", "scale"] == "mini"  # not run: no count known
    page = (tmp_path / "claims" / "claims.md").read_text()
    assert "| claim | verdict | scale | measure |" in page and "| mini, 0.001M parameters |" in page
    assert frame.set_index("id").loc["rms_matches_ln_quality", "verdict"] == "not run"
    assert "my_claim" in done.output and "reproduced" in done.output
    assert "rows (claims x sizes) reproduced at this scale" in (tmp_path / "claims" / "claims.md").read_text()
    assert "my_claim" in (tmp_path / "claims" / "claims.html").read_text()


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda b: b["predicate"].update(kind="bigger"), "predicate.kind"),
        (lambda b: b["source"].update(arxiv="soon"), "source.arxiv"),
        (lambda b: b["predicate"].pop("delta"), "predicate.delta"),
        (lambda b: b["compare"].pop("metric"), "compare.metric"),
        (lambda b: b.update(min_seeds=1), "min_seeds"),
        (
            lambda b: b.update(
                min_seeds=5,
                predicate={"kind": "stable_lr", "factor": 2},
                compare={**b["compare"], "tune": "train.lr"},
            ),
            "min_seeds",
        ),  # an exact test on 5 seeds can never reach 0.05
        (lambda b: b["sweep"].update(overrides=["norm"]), "sweep.overrides"),
        (lambda b: b["compare"].update(colour="red"), "compare.colour"),
        (lambda b: b.update(id="other"), "id"),
        (lambda b: b["compare"].update(a={"placment": "pre"}), "compare.a.placment"),
        (lambda b: b["compare"].update(b={"model.n_layers": 4}), "compare.b.model.n_layers"),
    ],
)
def test_a_malformed_claim_gets_one_line_naming_the_field(tmp_path, edit, field):
    path = write_claim(tmp_path, "bad", kind="equivalent", a={"norm": "rms"}, b={"norm": "ln"}, delta=0.02)
    body = yaml.safe_load(path.read_text())
    edit(body)
    path.write_text(yaml.safe_dump(body))
    with pytest.raises(ConfigError, match=re.escape(f"{path}: {field}:")):
        parse_claim(path)
    result = cli("claims", "check", str(path))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert f": {field}:" in result.output and "Traceback" not in result.output
    listed = cli("claims", "--config-dir", str(tmp_path))
    assert listed.exit_code == 2 and f": {field}:" in listed.output


def test_check_refuses_a_sweep_whose_jobs_cannot_train(tmp_path):
    """An experiment's key that the chosen corpus lacks (the batch_size experiment's synthetic validation
    size on tiny-shakespeare) composes, but no job of it could train: check says which job, before a run."""
    path = write_claim(tmp_path, "on_text", kind="worse", a={"norm": "bn"}, b={"norm": "ln"})
    body = yaml.safe_load(path.read_text())
    body["sweep"] = {"experiment": "batch_size", "overrides": ["data=shakespeare", "norm=bn,ln"]}
    path.write_text(yaml.safe_dump(body))
    result = cli("claims", "check", str(path))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "sweep: the job" in result.output and "unknown key data.val_sequences" in result.output


def test_check_accepts_every_shipped_claim():
    """Each claim's sweep composes, job by job, and holds both its arms, its tuned key and its scale."""
    for c in (c for c in load_registry() if c.size_of is None):
        result = cli("claims", "check", str(c.path))
        assert result.exit_code == 0 and result.output.startswith(f"ok: {c.id}"), result.output
        sizes = f"model={c.scale['model']}" + (f" and model={c.scale['larger']}" if c.scale["larger"] else "")
        assert f"{c.runs()} runs in its default sweep, at {sizes}" in result.output


def refused(tmp_path, edit, **claim):
    """``claims check`` of a planted claim after ``edit``: its one line, exit 2, no traceback."""
    path = write_claim(
        tmp_path, "bad", **{"kind": "better", "a": {"norm": "rms"}, "b": {"norm": "ln"}, **claim}
    )
    body = yaml.safe_load(path.read_text())
    edit(body)
    path.write_text(yaml.safe_dump(body))
    result = cli("claims", "check", str(path))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "Traceback" not in result.output and str(path) in " ".join(result.output.split())
    return " ".join(result.output.split())


def test_check_refuses_a_mistyped_override_key_naming_the_nearest(tmp_path):
    message = refused(tmp_path, lambda b: b["sweep"]["overrides"].append("train.stepz=5"))
    assert "sweep: unknown key train.stepz; did you mean train.steps?" in message


def test_check_refuses_an_arm_no_job_of_the_sweep_matches(tmp_path):
    message = refused(tmp_path, lambda b: b["compare"].update(a={"norm": "gn"}))
    assert "compare.a: no job of the sweep has norm=gn; the sweep offers norm=ln, rms" in message
    together = refused(tmp_path, lambda b: b["compare"].update(b={"norm": "ln", "placement": "post"}))
    assert (
        "compare.b: no job of the sweep has placement=post with norm=ln; the sweep offers placement=pre"
        in (together)
    )
    missing = refused(tmp_path, lambda b: b["compare"].update(a={"norm": "rms", "norm.epz": 1e-5}))
    assert "compare.a.norm.epz: not a key of the sweep's config; did you mean norm.eps?" in missing


def test_check_refuses_a_metric_normbench_does_not_write(tmp_path):
    message = refused(tmp_path, lambda b: b["compare"].update(metric="final_loss"))
    assert (
        "compare.metric: 'final_loss' is not a metric normbench writes; did you mean final_val_loss?"
        in message
    )
    assert "allowed: final_val_loss, best_val_loss" in message and "causal_leak.train" in message


def test_check_refuses_a_tuned_key_the_sweep_does_not_vary(tmp_path):
    message = refused(tmp_path, lambda b: b["compare"].update(tune="train.lr"))
    assert "compare.tune: the sweep runs train.lr at one value (0.003); allowed: norm, null" in message
    assert "the seed is what is repeated" in refused(tmp_path, lambda b: b["compare"].update(tune="seed"))


def test_check_refuses_a_scale_other_than_the_model_the_sweep_runs(tmp_path):
    message = refused(tmp_path, lambda b: b["scale"].update(model="micro"))
    assert "scale.model: 'micro', but the sweep runs model=mini" in message
    assert "scale: missing" in refused(tmp_path, lambda b: b.pop("scale"))
    huge = refused(tmp_path, lambda b: b["scale"].update(model="huge"))
    assert "scale.model: 'huge' is not a model size; allowed: gpt2, micro, midi, mini, small, tiny" in huge


def test_claims_run_refuses_a_broken_claim_before_launching_any(tmp_path):
    conf = tmp_path / "conf"
    write_claim(conf, "good", kind="better", a={"norm": "rms"}, b={"norm": "ln"})
    path = write_claim(conf, "bad", kind="better", a={"norm": "gn"}, b={"norm": "ln"})
    out = tmp_path / "claims"
    result = cli("claims", "run", "good", "bad", "--config-dir", str(conf), "--out", str(out))
    assert result.exit_code == 2 and f"{path}: compare.a: no job of the sweep has norm=gn" in " ".join(
        result.output.split()
    )
    assert not out.exists()  # not even the good claim's folder: nothing ran
    user = cli(
        "claims", "run", "good", "model=tiny", "--config-dir", str(conf), "--out", str(out), "--dry-run"
    )
    assert user.exit_code == 0, user.output  # the user's model=... is the size asked for, not a mistake


def test_the_articles_claims_run_at_mini_or_larger():
    """At micro (2 x 64) even normalization against none is inconclusive: the founding articles' claims
    run where a norm's effect shows."""
    articles = [c for c in load_registry() if c.source["kind"] == "article"]
    assert articles and all(c.scale["model"] in ("mini", "midi", "small") for c in articles), [
        (c.id, c.scale["model"]) for c in articles
    ]


def test_the_point_wise_norms_are_compared_at_one_alpha0():
    """DyT's 7B-LLaMA recipe (alpha0 0.8 before attention, 0.2 elsewhere) is not given to one arm only."""
    from normbench.claims.checking import check_claim, claim_args, job_row
    from normbench.sweeps.planning import job_configs

    for cid in ("dyt_matches_rms", "derf_beats_dyt"):
        (claim,) = [c for c in load_registry() if c.id == cid]
        check_claim(claim)
        alphas = set()
        for _, cfg in job_configs(claim_args(claim, [])):
            row = job_row(cfg)
            if row["norm"] in ("dyt", "derf"):
                positions = [row.get(f"norm.alpha_init_{p}") for p in ("attn", "mlp", "final")]
                alphas |= {row["norm.alpha_init"], *(a for a in positions if a is not None)}
        assert alphas == {0.5}, (cid, alphas)


def test_every_metric_a_claim_may_name_is_in_a_runs_summary(tmp_path):
    from normbench.core.fileio import leaves

    # with soft-caps: a capped run also writes each peak before the cap (*_raw)
    caps = ("train.stats_every=1", "model.attn_softcap=50", "model.logit_softcap=30")
    summary = leaves(train_tiny(tmp_path / "run", *caps))
    # the report computes floor_gap (final_val_loss - floor_loss); a claim, lr_sensitivity over a seed's grid
    report_only = {"floor_gap", "lr_sensitivity"}
    assert [m for m in METRIC_NAMES if m not in summary and m not in report_only] == []


def test_reports_writes_each_claims_own_report_and_links_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no published registry here
    from normbench.report import charts

    monkeypatch.setattr(charts, "CHARTS", ())  # the link, not the drawing, is under test
    pair(tmp_path / "claims" / "rms_matches_ln_quality", [2.0, 2.1, 2.05], [2.001, 2.099, 2.052])
    assert cli("claims", "report", str(tmp_path / "claims")).exit_code == 0
    before = pd.read_csv(tmp_path / "claims" / "claims.csv").set_index("id").loc["rms_matches_ln_quality"]
    assert before["report"].startswith("normbench report ")
    assert cli("claims", "report", "--reports", str(tmp_path / "claims")).exit_code == 0
    row = pd.read_csv(tmp_path / "claims" / "claims.csv").set_index("id").loc["rms_matches_ln_quality"]
    assert row["report"] == "rms_matches_ln_quality/report/report.html"
    assert (tmp_path / "claims" / row["report"]).is_file()
    assert (
        'href="rms_matches_ln_quality/report/report.html"'
        in (tmp_path / "claims" / "claims.html").read_text()
    )
    page = (tmp_path / "claims" / "claims.md").read_text()
    assert "| [`rms_matches_ln_quality`](rms_matches_ln_quality/report/report.html) | reproduced |" in page


def test_reports_warns_of_a_claim_it_cannot_report_and_reports_the_others(tmp_path, monkeypatch):
    """A claim whose runs have not finished, or whose folder also holds runs of other numerics (which a
    report refuses to mix), gets a warning naming why; the claims beside it are still reported."""
    monkeypatch.chdir(tmp_path)  # no published registry here
    from normbench.report import charts

    monkeypatch.setattr(charts, "CHARTS", ())
    root = tmp_path / "claims"
    pair(root / "rms_matches_ln_quality", [2.0, 2.1, 2.05], [2.001, 2.099, 2.052])
    pair(root / "norm_vs_none", [1.9, 1.98, 1.96], [2.0, 2.1, 2.05], b_norm="none")
    old = {**PROVENANCE, "numerics": provenance.NUMERICS - 1}
    plant(root / "norm_vs_none", "none_s3", seed=3, final=2.0, norm="none", provenance=old)
    (plant(root / "rms_faster", "rms_s0", seed=0, final=2.0, norm="rms") / "summary.json").unlink()
    result = cli("claims", "report", "--reports", str(root))
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"no report for {root / 'norm_vs_none'}: 1 run(s) of other numerics" in said
    assert f"no report for {root / 'rms_faster'}: no finished run in" in said
    assert (root / "rms_matches_ln_quality" / "report" / "report.html").is_file()
    assert not (root / "norm_vs_none" / "report").exists() and not (root / "rms_faster" / "report").exists()
    frame = pd.read_csv(root / "claims.csv").set_index("id")
    assert frame.loc["norm_vs_none", "verdict"] != "not run"  # judged on its current runs all the same


def test_markdown_page_is_the_commands_output_from_the_csv(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no published registry here
    pair(tmp_path / "claims" / "rms_matches_ln_quality", [2.0, 2.1, 2.05], [2.001, 2.099, 2.052])
    assert cli("claims", "report", str(tmp_path / "claims")).exit_code == 0
    page = cli("claims", "report", "--markdown", str(tmp_path / "claims" / "claims.csv"))
    assert page.exit_code == 0 and page.output == (tmp_path / "claims" / "claims.md").read_text()
    assert "| `rms_matches_ln_quality` | reproduced |" in page.output
    source = "Zhang & Sennrich 2019, arXiv 1910.07467"
    assert page.output.count(source) == 2  # once per claim of that paper, in the list of claims
    assert "- `rms_faster` (Zhang & Sennrich 2019, arXiv 1910.07467): " in page.output
    assert "| `rms_faster` |" not in page.output  # not run: listed, not in the table


def test_a_users_report_keeps_the_published_verdicts_of_claims_they_did_not_run(tmp_path, monkeypatch):
    """The published registry (results/claims/) recomputes to the same CSV and is never rewritten by a
    user's own report, whose claims not run read the published verdict, marked as published."""
    monkeypatch.chdir(tmp_path)
    published = Path("results/claims")
    pair(published / "rms_matches_ln_quality", [2.0, 2.1, 2.05], [2.001, 2.099, 2.052])
    assert cli("claims", "report", str(published)).exit_code == 0
    stored = (published / "claims.csv").read_bytes()
    assert cli("claims", "report", str(published)).exit_code == 0
    assert (published / "claims.csv").read_bytes() == stored  # recomputed, unchanged
    pair(Path("results/claims-local/norm_vs_none"), [1.9, 1.98, 1.96], [2.0, 2.1, 2.05], b_norm="none")
    done = cli("claims", "report")  # the user's own folder, results/claims-local
    assert done.exit_code == 0, done.output
    assert (published / "claims.csv").read_bytes() == stored
    mine = pd.read_csv("results/claims-local/claims.csv").set_index("id")
    assert mine.loc["rms_matches_ln_quality", "verdict"] == "reproduced"
    assert mine.loc["rms_matches_ln_quality", "provenance"].startswith(
        "published (results/claims/claims.csv)"
    )
    assert not mine.loc["norm_vs_none", "provenance"].startswith("published")
    # The published verdict was Holm-corrected with the published registry, not with the one claim run
    # here: the headline counts the two apart instead of calling all of them corrected across one family.
    page = Path("results/claims-local/claims.md").read_text()
    assert (
        "Holm-corrected across all 38 rows; 1 more as published (1 reproduced, corrected with the published "
        "registry)" in page
    )


def test_a_claim_run_with_overrides_says_so_in_its_row(tmp_path):
    from normbench.claims.running import record_overrides

    folder = tmp_path / "claims" / "short"
    pair(folder, [1.90, 1.98, 1.96], [2.0, 2.1, 2.05])
    claim = parse_claim(write_claim(tmp_path, "short", kind="better", a={"norm": "rms"}, b={"norm": "ln"}))
    record_overrides(folder, [])  # the registry's own sweep: nothing to say
    record_overrides(folder, ["hydra.launcher.n_jobs=2"])  # how it ran, not what it computed
    assert "overrides" not in assess(claim, folder).provenance
    record_overrides(folder, ["train.steps=3"])
    record_overrides(folder, ["train.steps=3"])
    v = assess(claim, folder)
    assert v.provenance.count("run with overrides train.steps=3, not the registry's sweep") == 1


def test_the_published_verdicts_recompute_from_their_committed_records(monkeypatch):
    """results/claims/claims.csv is what claims report computes from the run records committed beside
    it (the same command, from the repository's root): every word, estimate, interval and provenance."""
    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    published = Path("results/claims")
    fresh = output.rows(assess_all(load_registry(), [published], holm=True), published)
    stored = output.read_csv(published / "claims.csv")
    fresh = output.read_csv(io.StringIO(fresh.to_csv(index=False)))
    assert list(fresh["id"]) == list(stored["id"])
    assert (published / "README.md").read_text() == output.readme(stored)  # written from the CSV alone
    for column in output.COLUMNS:
        a, b = fresh[column], stored[column]
        if pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(b):
            assert np.allclose(a, b, rtol=1e-9, atol=0, equal_nan=True), column
        else:
            assert list(a.fillna("").astype(str)) == list(b.fillna("").astype(str)), column


def test_every_record_the_published_verdicts_read_is_committed_not_ignored():
    """A record the report reads (a run's config, summary and metrics; a claim's copy, rule and
    pre-registration) that git ignores would recompute here and not in a fresh clone."""
    root = conf_dir().parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    read = {"config.yaml", "summary.json", "metrics.jsonl", "claim.yaml", "overrides.yaml", "rule.yaml"}
    read.add("prereg.yaml")
    listed = subprocess.run(
        ["git", "ls-files", "--others", "--ignored", "--exclude-standard", "results/claims"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    ignored = [p for p in listed if Path(p).name in read and ".hydra" not in Path(p).parts]
    assert ignored == []


def test_each_published_rows_rule_pilot_and_confirmation_follow_each_other_on_main():
    """A row's rule was committed strictly before its pilot's commit, and that before its confirmation's:
    each commit an ancestor of the next, and of today's (the check needs the history: a shallow clone
    skips it)."""
    root = conf_dir().parent
    if not (root / ".git").exists() or (root / ".git" / "shallow").exists():
        pytest.skip("needs the repository's whole history")

    def before(first: str, then: str) -> bool:
        ancestor = ["git", "merge-base", "--is-ancestor", first, then]
        return first != then and subprocess.run(ancestor, cwd=root, capture_output=True).returncode == 0

    frame = output.read_csv(root / "results" / "claims" / "claims.csv")
    ran = frame[frame["verdict"].ne("not run")]
    assert not ran.empty
    for _, row in ran.iterrows():
        chain = [row["rule_commit"], row["pilot_commit"], row["confirm_commit"], "HEAD"]
        chain = [str(c) for c in chain if isinstance(c, str) and c]
        assert len(chain) >= 3, row["id"]  # a rule and a pilot at least
        assert all(before(a, b) for a, b in itertools.pairwise(chain)), (row["id"], chain)


@pytest.mark.parametrize("page", ["results/claims/claims.md"])
def test_the_committed_pages_are_the_commands_output(page):
    """The registry's own page: normbench claims report --markdown of the committed CSV, not a
    hand-edited number."""
    root = conf_dir().parent
    expected = output.markdown(output.read_csv(root / "results" / "claims" / "claims.csv"))
    assert (root / page).read_text() == expected


def test_the_readmes_headline_is_the_commands_output():
    """The README's table of what holds at this scale: claims report --markdown CSV --headline."""
    root = conf_dir().parent
    csv = root / "results" / "claims" / "claims.csv"
    frame = output.read_csv(csv)
    assert output.headline_table(frame) in (root / "README.md").read_text()
    page = cli("claims", "report", "--markdown", str(csv), "--headline")
    assert page.exit_code == 0 and page.output == output.headline_table(frame)


TINY_CLAIM = [
    "model=tiny",
    "norm=ln,rms",
    "train.steps=3",
    "train.eval_every=1",
    "train.batch_size=4",
    "train.eval_batches=1",
    "data.train_sequences=64",
    "data.val_sequences=16",
    "train.progress=false",
    "train.threads=1",
    "seed=0",
]


@pytest.mark.slow  # normbench claims run: a sweep's job processes
def test_claims_run_resumes_an_interrupted_claim_and_keeps_finished_runs(tmp_path):
    """A run cut short leaves its config.yaml and no summary.json; running the claim again trains it
    again, keeps the finished run untouched, and the report reads the claim from the same folder."""
    conf = tmp_path / "conf"
    path = write_claim(conf, "tiny_claim", kind="equivalent", a={"norm": "rms"}, b={"norm": "ln"}, delta=0.5)
    body = yaml.safe_load(path.read_text())
    body["sweep"]["overrides"] = TINY_CLAIM
    body["scale"]["model"] = "tiny"
    path.write_text(yaml.safe_dump(body))
    args = ["claims", "run", "tiny_claim", "--config-dir", str(conf), "--out", str(tmp_path / "claims")]
    # --config-dir before the verb: a user's claim runs, and the run ends with its verdict
    before = ["claims", "--config-dir", str(conf), "run", "tiny_claim", "--out", str(tmp_path / "claims")]
    first = run_cli(*before, cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    assert re.search(r"tiny_claim\s*│\s*inconclusive", first.stdout), first.stdout
    folder = tmp_path / "claims" / "tiny_claim"
    runs = sorted(d for d in folder.iterdir() if (d / "summary.json").exists())
    assert [d.name.split("-")[0] for d in runs] == ["ln", "rms"]
    assert (folder / "claim.yaml").read_text() == path.read_text()
    kept, cut = runs
    (cut / "summary.json").unlink()  # as a kill mid-run leaves it
    before = (kept / "summary.json").stat().st_mtime_ns

    again = run_cli(*args, "train.steps=3", cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 has results (1 completed), 1 to run (1 interrupted among them)" in " ".join(
        again.stdout.split()
    )
    assert (kept / "summary.json").stat().st_mtime_ns == before
    assert json.loads((cut / "summary.json").read_text())["status"] == "completed"
    reported = run_cli("claims", "report", str(tmp_path / "claims"), "--config-dir", str(conf), cwd=tmp_path)
    assert reported.returncode == 0, reported.stdout + reported.stderr
    assert reported.stdout.count("wrote ") == 1, reported.stdout
    row = pd.read_csv(tmp_path / "claims" / "claims.csv").set_index("id").loc["tiny_claim"]
    assert (row["n_a"], row["n_b"]) == (1, 1) and row["verdict"] == "inconclusive"
    assert "fewer than min_seeds 3" in row["reason"]


def test_a_claims_sweep_is_its_own_then_the_users_overrides_into_its_folder(tmp_path):
    from normbench.claims.running import sweep_args

    (claim,) = [c for c in load_registry() if c.id == "rms_matches_ln_quality"]
    args = sweep_args(claim, ["train.steps=3", "placement=post"], tmp_path, config_dir=tmp_path)
    assert args == [
        "experiment=lr_sensitivity",
        "data=shakespeare",
        "model=mini",
        "norm=ln,rms",
        "train.steps=3",
        "placement=post",  # the user's value replaces the claim's
        f"hydra.searchpath=[file://{tmp_path.resolve()}]",
        f"hydra.sweep.dir={(tmp_path / claim.id).resolve()}",
    ]
    with pytest.raises(ConfigError, match="--out DIR"):
        sweep_args(claim, ["hydra.sweep.dir=elsewhere"], tmp_path)


@pytest.mark.parametrize(
    "args, message",
    [
        (["claims", "run"], "name the claims to run"),
        (["claims", "run", "no_such_claim"], "no claim 'no_such_claim'; allowed: bn_batch_one"),
        (["claims", "run", "--fast", "norm_vs_none"], "unknown option --fast"),
        (["claims", "report", "no/such/folder"], "no/such/folder: no such folder"),
        (["claims", "report", "--markdown", "missing.csv"], "cannot read claims CSV missing.csv"),
    ],
)
def test_claims_commands_refuse_bad_input_in_one_line(args, message):
    result = cli(*args)
    assert result.exit_code == 2 and message in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output

"""A claim's two stages (normbench.claims.confirming): the pre-registration its pilot fixes, the verdict
from its confirmation alone, one-sided with the refutation named, and the word for a treatment that
never engages (normbench.claims.engagement)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from planted import plant, write_claim
from scipy import stats
from typer.testing import CliRunner

from normbench.claims import confirming, power, prereg
from normbench.claims.schema import parse_claim
from normbench.claims.verdicts import assess
from normbench.cli import app
from normbench.core.errors import ConfigError

PILOT_A = [1.90, 1.96, 1.93]  # rms at its best rate, 0.01
PILOT_B = [2.00, 2.03, 2.02]  # ln at its best rate, 0.003


GRID = (0.001, 0.003, 0.01, 0.03)


def pilot(registry, best_a=0.01, best_b=0.003):
    """rms (a) best at 0.01, ln (b) best at 0.003, each 0.3 worse at every other rate of GRID, seeds 0-2."""
    for seed, (la, lb) in enumerate(zip(PILOT_A, PILOT_B)):
        for lr in GRID:
            worse_a, worse_b = (0.0 if lr == best else 0.3 for best in (best_a, best_b))
            plant(registry / "tuned", f"rms_s{seed}_{lr}", seed=seed, final=la + worse_a, norm="rms", lr=lr)
            plant(registry / "tuned", f"ln_s{seed}_{lr}", seed=seed, final=lb + worse_b, norm="ln", lr=lr)


def claim_of(tmp_path, **kw):
    spec = {"kind": "better", "a": {"norm": "rms"}, "b": {"norm": "ln"}, "tune": "train.lr", **kw}
    return parse_claim(write_claim(tmp_path / "conf", "tuned", **spec))


def test_the_pilot_fixes_each_arms_value_fresh_seeds_and_their_count(tmp_path):
    registry = tmp_path / "claims"
    pilot(registry)
    claim = claim_of(tmp_path)
    said = confirming.preregister(claim, registry, family=27)
    design = prereg.read(registry, "tuned")
    assert design.values == {"a": 0.01, "b": 0.003}
    assert not set(design.seeds) & {0, 1, 2} and len(design.seeds) == design.planned_n
    d = np.subtract(PILOT_A, PILOT_B)  # the paired differences at the arms' values
    expected, _ = power.planned_seeds(abs(d.mean()), float(np.std(d, ddof=1)), 2, 0.05 / 27)
    assert design.planned_n == max(expected, claim.min_seeds)
    assert design.level == pytest.approx(0.05 / 27) and design.margin == 0
    assert "not reproduced: a - b > 0 one-sided" in design.direction
    assert f"{design.planned_n} seeds per arm" in said and "a at train.lr=0.01, b at train.lr=0.003" in said


@pytest.mark.parametrize("best_a, end", [(0.001, "smallest"), (0.03, "largest")])
def test_a_pilot_whose_arm_is_best_at_its_grids_edge_plans_no_confirmation(tmp_path, best_a, end):
    """rms is best at the grid's end: a confirmation fixed there might not hold rms at its best, so the
    pilot says so in its reason and preregister refuses in one line, naming the arm and the value."""
    registry = tmp_path / "claims"
    pilot(registry, best_a=best_a)
    claim = claim_of(tmp_path)
    said = f"a's best train.lr ({best_a:g}) is the grid's {end}"
    assert said in confirming.plan(claim, confirming.pilot_runs(claim, registry), family=27)
    assert said in assess(claim, registry / "tuned", family=27).outcome.reason
    with pytest.raises(ConfigError, match=r"a confirmation fixed there may not hold that arm at its best"):
        confirming.preregister(claim, registry, family=27)
    assert prereg.read(registry, "tuned") is None


@pytest.mark.parametrize("cost_s, warned", [(None, True), (6.0, False), (6000.0, True)])
def test_a_confirmation_over_its_budget_is_planned_with_a_warning_that_gives_its_time(
    tmp_path, cost_s, warned
):
    """A noisy pilot plans more seeds than the seed budget; a claim whose runs are measured cheap
    (cost_s over its default sweep's 6 runs) is within power.BUDGET_S and planned without a word; an
    expensive one, or one without a measured cost past power.BUDGET_SEEDS, is planned all the same
    with a warning that says its runs and minutes (or that its time is not known)."""
    registry = tmp_path / "claims"
    for seed, (la, lb) in enumerate(zip([1.90, 2.02, 1.95], [2.00, 2.01, 2.02])):
        plant(registry / "tuned", f"rms_s{seed}", seed=seed, final=la, norm="rms", lr=0.01)
        plant(registry / "tuned", f"ln_s{seed}", seed=seed, final=lb, norm="ln", lr=0.01)
    claim = claim_of(tmp_path)
    body = yaml.safe_load(claim.path.read_text())
    if cost_s is not None:
        body["cost_s"] = cost_s
    claim.path.write_text(yaml.safe_dump(body, sort_keys=False))
    claim = parse_claim(claim.path)
    d = np.subtract([1.90, 2.02, 1.95], [2.00, 2.01, 2.02])
    n, _ = power.planned_seeds(abs(d.mean()), float(np.std(d, ddof=1)), 2, 0.05 / 27)
    assert n > power.BUDGET_SEEDS  # the pilot's spread plans more seeds than the seed budget
    said = " ".join(confirming.preregister(claim, registry, family=27).split())
    assert prereg.read(registry, "tuned").planned_n == n  # 2 runs a seed (one rate shared)
    if not warned:
        assert "warning" not in said
    elif cost_s is None:
        assert f"warning: {n} seeds per arm is over the budget of {power.BUDGET_SEEDS}" in said
    else:
        assert f"warning: {2 * n} runs, about {2 * n * 1000 / 60:.0f} min at 1e+03 s a run" in said


def test_an_inconclusive_claim_not_pre_registered_says_the_confirmation_that_would_decide_it(tmp_path):
    """Its reason is the plan at the registry's family level, the one preregister would write."""
    registry = tmp_path / "claims"
    pilot(registry)
    claim = claim_of(tmp_path)
    v = assess(claim, registry / "tuned", alpha=0.05 / 27, family=27)
    assert v.word == "inconclusive"
    confirming.preregister(claim, registry, family=27)
    n = prereg.read(registry, "tuned").planned_n
    runs = 4 * n  # each seed at both arms' values, 0.01 and 0.003: four runs, two of them read
    assert v.outcome.reason == (
        f"a confirmation of {n} seeds per arm ({runs} runs) has 80% power at level {0.05 / 27:.3g} "
        "for the pilot's estimate: normbench claims preregister tuned"
    )


def test_a_pilot_of_another_sweep_does_not_plan_the_claim(tmp_path):
    registry = tmp_path / "claims"
    pilot(registry)
    claim = claim_of(tmp_path)
    stored = yaml.safe_load(claim.path.read_text())
    stored["sweep"]["overrides"].append("model.n_layer=8")  # the design the pilot ran
    (registry / "tuned" / "claim.yaml").write_text(yaml.safe_dump(stored))
    with pytest.raises(ConfigError, match="ran another sweep than the claim's now"):
        confirming.preregister(claim, registry, family=27)
    assert prereg.read(registry, "tuned") is None
    v = assess(claim, registry / "tuned", alpha=0.05 / 27, family=27)
    assert v.word == "inconclusive"
    assert v.outcome.reason == "its runs are of an earlier sweep: normbench claims run tuned runs its pilot"


def confirmation(registry, design, a, b, **kw):
    """Confirmation runs at the design's seeds and values; a decoy at a value not pre-registered."""
    out = prereg.folder(registry, design.id)
    for seed, la, lb in zip(design.seeds, a, b):
        plant(out, f"rms_s{seed}", seed=seed, final=la, norm="rms", lr=design.values["a"], **kw)
        plant(out, f"ln_s{seed}", seed=seed, final=lb, norm="ln", lr=design.values["b"], **kw)
        plant(out, f"rms_s{seed}_decoy", seed=seed, final=0.5, norm="rms", lr=0.1, **kw)


@pytest.mark.parametrize(
    "shift, word", [(-0.08, "reproduced"), (+0.08, "not reproduced"), (0.0, "inconclusive")]
)
def test_the_verdict_is_the_confirmations_alone_one_sided(tmp_path, shift, word):
    """The claimed side (a lower) reads reproduced, the opposite side not reproduced, each one-sided at
    the level; the pilot's runs and a run at a value not pre-registered are not read."""
    registry = tmp_path / "claims"
    pilot(registry)
    claim = claim_of(tmp_path)
    confirming.preregister(claim, registry, family=27)
    design = prereg.read(registry, "tuned")
    rng = np.random.default_rng(1)
    b = 2.0 + rng.normal(0, 0.01, design.planned_n)
    a = b + shift + rng.normal(0, 0.01, design.planned_n)
    confirmation(registry, design, a, b)
    v = assess(claim, registry / "tuned", alpha=0.05 / 27)
    side = "less" if shift <= 0 else "greater"
    p = stats.ttest_rel(a, b, alternative=side).pvalue
    assert v.word == word and v.outcome.n_a == design.planned_n
    assert v.outcome.estimate == pytest.approx(np.mean(a - b))
    if word != "inconclusive":
        assert v.outcome.p == pytest.approx(p) and v.outcome.level.endswith("one-sided")
    assert "pre-registered confirmation" in v.outcome.test and v.design == design


def test_a_pre_registered_claim_reads_inconclusive_until_its_confirmation_runs(tmp_path):
    registry = tmp_path / "claims"
    pilot(registry)
    claim = claim_of(tmp_path)
    confirming.preregister(claim, registry, family=27)
    v = assess(claim, registry / "tuned")
    assert v.word == "inconclusive" and "its confirmation has not run" in v.outcome.reason
    assert np.isnan(v.outcome.p)  # outside the Holm family until tested


def test_fewer_confirmed_seeds_than_planned_cannot_decide(tmp_path):
    registry = tmp_path / "claims"
    pilot(registry)
    claim = claim_of(tmp_path)
    confirming.preregister(claim, registry, family=27)
    design = prereg.read(registry, "tuned")
    design.seeds = design.seeds[:2]
    confirmation(registry, design, [1.5, 1.5], [2.0, 2.01])
    v = assess(claim, registry / "tuned")
    assert v.word == "inconclusive" and f"fewer than min_seeds {design.planned_n}" in v.outcome.reason


def test_a_claim_changed_after_its_pre_registration_is_a_new_design(tmp_path):
    registry = tmp_path / "claims"
    pilot(registry)
    claim = claim_of(tmp_path)
    confirming.preregister(claim, registry, family=27)
    body = yaml.safe_load(claim.path.read_text())
    body["predicate"]["kind"] = "worse"
    claim.path.write_text(yaml.safe_dump(body))
    with pytest.raises(ConfigError, match="changed since its pre-registration"):
        confirming.confirm(parse_claim(claim.path), registry, [])
    design = prereg.read(registry, "tuned")
    confirmation(registry, design, [1.5] * design.planned_n, [2.0] * design.planned_n)
    with pytest.raises(ConfigError, match="its confirmation has runs"):
        confirming.preregister(claim, registry, family=27)
    v = assess(parse_claim(claim.path), registry / "tuned")  # its runs test the design before the change
    assert v.word == "inconclusive" and "changed since its pre-registration" in v.outcome.reason


def test_confirm_without_a_pre_registration_says_so_in_one_line(tmp_path):
    registry = tmp_path / "claims"
    pilot(registry)
    claim_of(tmp_path)
    conf = tmp_path / "conf"
    args = ["claims", "confirm", "tuned", "--config-dir", str(conf), "--out", str(registry)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    first = f"normbench claims --config-dir {conf.resolve()} preregister tuned --out {registry} first"
    assert f"tuned: not pre-registered: {first}" in result.output


def test_a_treatment_that_never_engages_is_not_testable_with_its_measurement(tmp_path):
    """The cap is 50; the uncapped arm's attention logits peak at 27: the cap never acts, whatever
    the losses say."""
    registry = tmp_path / "claims"
    for seed, (la, lb) in enumerate(zip([1.9, 1.95, 1.92], [2.0, 2.1, 2.05])):
        for norm, loss, peak in (("rms", la, 20.0), ("ln", lb, 27.0 - seed)):
            run = plant(registry / "capped", f"{norm}_s{seed}", seed=seed, final=loss, norm=norm)
            summary = json.loads((run / "summary.json").read_text())
            (run / "summary.json").write_text(json.dumps({**summary, "max_attn_logit": peak}))
    path = write_claim(tmp_path / "conf", "capped", kind="better", a={"norm": "rms"}, b={"norm": "ln"})
    body = yaml.safe_load(path.read_text())
    body["engages"] = {"metric": "max_attn_logit", "reaches": 50.0, "arm": "b", "why": "the cap acts at 50"}
    path.write_text(yaml.safe_dump(body))
    v = assess(parse_claim(path), registry / "capped")
    assert v.word == "not testable at this scale"
    measured = "peak max_attn_logit 27 < 50 in every run of b (3 runs, from 25)"
    assert v.outcome.reason == f"the cap acts at 50: {measured}"
    body["engages"]["reaches"] = 26.0  # one run reaches it: the treatment engages, the losses decide
    path.write_text(yaml.safe_dump(body))
    assert assess(parse_claim(path), registry / "capped").word == "reproduced"

"""The claims registry's stability predicates on planted run directories, each verdict computed here by
hand (scipy): the share of unstable runs (rate, Fisher's exact test) and the largest stable rate
(stable_lr, the exact sign-flip test on per-seed ratios)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from planted import plant, verdict_of, write_claim
from scipy import stats

from normbench.claims import power
from normbench.claims.confirming import design
from normbench.claims.predicates import judge
from normbench.claims.schema import parse_claim
from normbench.report.load import find_inputs, load_runs

# ----------------------------------------------------------------------------- rate


@pytest.mark.parametrize(
    "a_div, b_div, word", [(0, 6, "reproduced"), (6, 0, "not reproduced"), (1, 2, "inconclusive")]
)
def test_rate_is_fishers_exact_test(tmp_path, a_div, b_div, word):
    runs = tmp_path / "runs"
    for norm, diverged in (("rms", a_div), ("ln", b_div)):
        for seed in range(8):
            status = "diverged" if seed < diverged else "completed"
            plant(runs, f"{norm}_s{seed}", seed=seed, norm=norm, final=2.0, status=status)
    claim = write_claim(
        tmp_path, "rate", kind="rate", a={"norm": "rms"}, b={"norm": "ln"}, direction="fewer", min_seeds=8
    )
    out = verdict_of(tmp_path, claim, runs)
    table = [[a_div, 8 - a_div], [b_div, 8 - b_div]]
    # the one-sided test either way, whichever decides the word (Holm orders by it)
    p = min(stats.fisher_exact(table, alternative=side).pvalue for side in ("less", "greater"))
    assert out.verdict == word and out.p == pytest.approx(p)
    assert out.estimate == pytest.approx((a_div - b_div) / 8)
    if word == "inconclusive":
        assert "runs per arm would settle it" in out.reason


def test_rate_counts_a_run_that_finished_without_learning_as_unstable(tmp_path):
    """A run stuck near its initial loss (4.0 here; above 0.9 of it) failed as surely as one that diverged:
    with 6 such runs of b and none of a, DeepNorm-style fewer-failures claims read reproduced, as Fisher's
    test on 0/8 vs 6/8 says; counting the diverged status alone they would read 'no run diverged'."""
    runs = tmp_path / "runs"
    for seed in range(8):
        plant(runs, f"rms_s{seed}", seed=seed, norm="rms", final=2.0)
        plant(runs, f"ln_s{seed}", seed=seed, norm="ln", final=3.9 if seed < 6 else 2.0)
    claim = write_claim(
        tmp_path, "rate", kind="rate", a={"norm": "rms"}, b={"norm": "ln"}, direction="fewer", min_seeds=8
    )
    out = verdict_of(tmp_path, claim, runs)
    assert out.verdict == "reproduced" and out.test.endswith("(0/8 vs 6/8 unstable)")
    assert out.p == pytest.approx(stats.fisher_exact([[0, 8], [6, 2]], alternative="less").pvalue)


# ----------------------------------------------------------------------------- stable learning rate


def plant_stability(runs, a_first, b_first, seeds=6, stuck=None, failed=None):
    """Each arm unstable from rate ``first`` up (None: never), over ``seeds`` seeds; ``stuck``: a's
    rate at which seed 0 finishes but stays near its start (4.0 -> 3.95); ``failed``: a's rate at
    which seed 0 failed for another reason."""
    for norm, first in (("rms", a_first), ("ln", b_first)):
        for seed in range(seeds):
            for lr in (0.01, 0.02, 0.04, 0.08):
                status = "diverged" if first and lr >= first else "completed"
                final = 2.0 + lr + seed * 0.01
                if norm == "rms" and seed == 0 and lr == stuck:
                    final = 3.95
                if norm == "rms" and seed == 0 and lr == failed:
                    status = "failed"
                plant(runs, f"{norm}_{lr}_s{seed}", seed=seed, norm=norm, lr=lr, final=final, status=status)


def stable_claim(tmp_path, **options):
    return write_claim(
        tmp_path,
        "stable",
        kind="stable_lr",
        a={"norm": "rms"},
        b={"norm": "ln"},
        tune="train.lr",
        factor=1.41,
        **options,
    )


@pytest.mark.parametrize(
    "a_first, b_first, seeds, word",
    [
        (0.08, 0.04, 6, "reproduced"),
        (0.08, 0.04, 3, "inconclusive"),  # too few seeds for an exact test to reach 0.05
        (0.02, 0.04, 6, "not reproduced"),
        (0.04, None, 6, "not reproduced"),  # b never went unstable: its true rate is higher still
        (None, None, 6, "inconclusive"),
        (None, 0.08, 6, "reproduced"),  # a never went unstable: its true ratio is higher still
    ],
)
def test_stable_lr_is_the_largest_rate_that_stayed_stable(tmp_path, a_first, b_first, seeds, word):
    plant_stability(tmp_path / "runs", a_first, b_first, seeds)
    out = verdict_of(tmp_path, stable_claim(tmp_path), tmp_path / "runs")
    assert out.verdict == word
    if seeds < 6:  # an exact test on fewer can never reach 0.05
        assert "fewer than min_seeds 6" in out.reason
        return
    stable = {first: (first or 0.16) / 2 for first in (a_first, b_first)}
    assert out.estimate == pytest.approx(stable[a_first] / stable[b_first])
    if a_first is None and b_first is None:
        assert "widen the grid" in out.reason


def test_a_run_stuck_near_its_start_is_not_stable(tmp_path):
    """a's seed 0 at 0.04 ends at 3.95 from 4.0: it did not learn, so its largest stable rate is 0.02."""
    plant_stability(tmp_path / "runs", 0.08, 0.04, stuck=0.04)
    out = verdict_of(tmp_path, stable_claim(tmp_path), tmp_path / "runs")
    ratios = [0.02 / 0.02] + [0.04 / 0.02] * 5
    assert out.estimate == pytest.approx(math.exp(np.mean(np.log(ratios))))


def test_a_failed_run_is_left_out_and_said_so(tmp_path):
    """a's seed 0 crashed at 0.08, above its stable 0.04: its limit is unknown, so the seed is left out
    rather than read as unstable at 0.08 (which would put it at 0.04 against the others' 0.08)."""
    plant_stability(tmp_path / "runs", None, 0.04, seeds=7, failed=0.08)
    out = verdict_of(tmp_path, stable_claim(tmp_path), tmp_path / "runs")
    assert "1 failed run(s) left out" in out.reason and out.n_a == 6
    assert out.estimate == pytest.approx(0.08 / 0.02)


def test_a_seed_unstable_at_every_rate_counts_below_the_grid_as_a_bound(tmp_path):
    """a's seed 0 diverges at every rate: its largest stable rate is below the grid, read one step
    below its smallest (0.005) rather than dropped; the ratio is then an upper bound, so it can read
    not reproduced but never reproduced (hand-computed geometric mean of the per-seed ratios)."""
    runs = tmp_path / "runs"
    plant_stability(runs, 0.04, 0.04)
    for lr in (0.01, 0.02):  # seed 0 of a: unstable from the grid's smallest rate
        summary = runs / f"rms_{lr}_s0" / "summary.json"
        summary.write_text(json.dumps({**json.loads(summary.read_text()), "status": "diverged"}))
    out = verdict_of(tmp_path, stable_claim(tmp_path), runs)
    assert out.n_a == 6 and "1 seed(s) of a unstable at every rate" in out.reason
    ratios = [0.005 / 0.02] + [0.02 / 0.02] * 5
    assert out.estimate == pytest.approx(math.exp(np.mean(np.log(ratios))))
    assert out.verdict != "reproduced"


def test_a_grid_where_nothing_learns_asks_for_lower_rates(tmp_path):
    """Every run of both arms ends near its start (a post-norm model stuck at the unigram loss): no rate
    on the grid is stable, so the verdict asks for the grid to go lower instead of reading a ratio."""
    runs = tmp_path / "runs"
    plant_stability(runs, None, None)
    for summary in runs.glob("*/summary.json"):
        summary.write_text(json.dumps({**json.loads(summary.read_text()), "final_val_loss": 3.95}))
    out = verdict_of(tmp_path, stable_claim(tmp_path), runs)
    assert out.verdict == "inconclusive"
    assert "unstable at every rate from train.lr=0.01: extend the grid below it" in out.reason


def test_a_stable_lr_pilot_without_spread_plans_the_seeds_that_decide_at_the_family_level(tmp_path):
    """Three pilot seeds, each arm's edge one doubling apart on every seed: the plan is read from the
    estimate and the grid's rounding alone, and at the planned seeds the same pattern decides at the
    family's level (judged here on planted runs), one seed fewer does not."""
    claim = parse_claim(stable_claim(tmp_path, min_seeds=12))
    plant_stability(tmp_path / "pilot", 0.08, 0.04, seeds=3)
    pilot = load_runs(find_inputs([tmp_path / "pilot"])[0], lambda m: None)
    planned = design(claim, pilot, family=27)
    level = power.family_level(27)
    # distance from the bound: log2(2) - log2(1.41), on a grid of step 1 (log2): the floored se 1/sqrt(6 n)
    t = stats.t.ppf(1 - level / 2, np.arange(2, 40) - 1) / np.sqrt(6 * np.arange(2, 40))
    by_hand = int(np.arange(2, 40)[(t < 1 - math.log2(1.41)) & (2 / 2.0 ** np.arange(2, 40) < level)][0])
    assert planned.planned_n == max(by_hand, 12)
    for n, word in ((by_hand, "reproduced"), (by_hand - 1, "inconclusive")):
        runs = tmp_path / f"confirm{n}"
        plant_stability(runs, 0.08, 0.04, seeds=n)
        d = load_runs(find_inputs([runs])[0], lambda m: None)
        assert judge(dataclasses.replace(claim, min_seeds=2), d, level).verdict == word

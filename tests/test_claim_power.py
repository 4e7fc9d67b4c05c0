"""Planning a claim's confirmation (normbench.claims.power), checked against independent computations:
a simulation of the planned test, the exact test's floor counted by hand, a chi-square bound by
simulation, and ``claims check`` refusing a design that cannot decide at its family's level."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import yaml
from planted import write_claim
from scipy import stats
from typer.testing import CliRunner

from normbench.claims import power
from normbench.claims.smallsample import exact_p
from normbench.cli import app


def one_sided_t_passes(d: np.ndarray, level: float) -> bool:
    """scipy's one-sample t test of the differences against 0, one-sided (greater)."""
    return stats.ttest_1samp(d, 0.0, alternative="greater").pvalue < level


@pytest.mark.parametrize("distance, sd, pilot_df", [(0.05, 0.01, 2), (0.2, 0.03, 2), (0.02, 0.008, 5)])
def test_a_planted_effect_at_the_planned_seeds_is_detected_80_percent_of_the_time(distance, sd, pilot_df):
    """Draws of n pairs from the planned effect at the spread planned with (the pilot's at its upper
    bound), tested one-sided at the family's level: at least 80% pass at the planned n, and fewer than
    80% at one seed fewer (the count is the least that gives the power)."""
    level = power.family_level(27)
    n, planned_sd = power.planned_seeds(distance, sd, pilot_df, level)
    rng = np.random.default_rng(7)
    draws = 2000

    def rate(k):
        return np.mean([one_sided_t_passes(rng.normal(distance, planned_sd, k), level) for _ in range(draws)])

    assert rate(n) >= 0.8
    if n > 2:
        assert rate(n - 1) < 0.8


def test_the_planned_spread_is_the_pilots_upper_80_percent_bound():
    """A pilot of 3 seeds (2 degrees of freedom) plans with about 2.1x its spread; by simulation the
    bound lies above the true spread in 80% of pilots."""
    assert power.spread_upper(1.0, 2) == pytest.approx(math.sqrt(2 / stats.chi2.ppf(0.2, 2)))
    assert 2.0 < power.spread_upper(1.0, 2) < 2.2
    rng = np.random.default_rng(3)
    sds = np.std(rng.normal(0.0, 1.0, (20000, 3)), axis=1, ddof=1)
    covered = np.mean([power.spread_upper(s, 2) >= 1.0 for s in sds])
    assert covered == pytest.approx(0.8, abs=0.01)


@pytest.mark.parametrize("n", [3, 6, 10])
def test_the_smallest_exact_p_is_one_sign_pattern_in_2_to_the_n(n):
    """n identical positive differences: of the 2^n sign flips, counted here by hand, only the
    all-positive one reaches the observed mean, so the one-sided p is 1 / 2^n, as the exact test and
    the floor say."""
    d = [0.3] * n
    flips = list(itertools.product((1, -1), repeat=n))
    as_extreme = sum(1 for f in flips if np.mean(np.multiply(f, d)) >= np.mean(d) - 1e-12)
    assert as_extreme == 1
    a = {s: 1.0 + x for s, x in enumerate(d)}
    b = {s: 1.0 for s in range(n)}
    assert exact_p(a, b, side=+1) == pytest.approx(as_extreme / len(flips)) == power.smallest_p(n)


def test_an_exact_test_needs_10_pairs_at_the_first_holm_level_of_27():
    level = power.family_level(27)  # 0.05 / 27 = 0.00185
    assert power.exact_pairs(level) == 10  # 1/1024 < 0.00185 <= 1/512
    assert power.cannot_decide("stable_lr", 6, level).startswith("an exact test on 6 pairs")
    assert power.cannot_decide("stable_lr", 10, level) == ""
    _, planned_sd = power.planned_seeds(1.0, 0.0, 2, level)
    assert power.planned_seeds(1.0, 0.0, 2, level, exact=True)[0] == 10 and planned_sd == 0


def test_an_equivalence_inside_its_margin_needs_the_spread_its_seeds_allow():
    """TOST at level L on n pairs passes at an estimate of 0 only if t_{n-1,1-L} s / sqrt(n) < delta."""
    level, n, delta = 0.002, 6, 0.02
    needed = power.spread_needed(n, delta, level)
    assert stats.t.ppf(1 - level, n - 1) * needed / math.sqrt(n) == pytest.approx(delta)
    assert power.cannot_decide("equivalent", n, level, delta, spread=needed * 1.1, estimate=0.0)
    assert not power.cannot_decide("equivalent", n, level, delta, spread=needed * 0.9, estimate=0.0)
    # a pilot beyond the margin is planned to refute it: a wide spread does not stop that
    assert not power.cannot_decide("equivalent", n, level, delta, spread=needed * 3, estimate=0.2)


def test_check_refuses_an_exact_design_that_cannot_reach_its_family_level(tmp_path):
    """A stable-rate claim on 6 seeds joins the registry's family (28 claims): its exact test cannot
    give a p below 1/64, above 0.05 / 28; check says so in one line, exit 2; 10 seeds pass."""
    path = write_claim(
        tmp_path, "stable", kind="stable_lr", a={"norm": "rms"}, b={"norm": "ln"}, tune="train.lr", factor=1.0
    )
    body = yaml.safe_load(path.read_text())
    body["sweep"]["overrides"] = ["norm=ln,rms", "train.lr=1e-2,2e-2", "seed=0,1,2,3,4,5"]
    path.write_text(yaml.safe_dump(body))
    result = CliRunner().invoke(app, ["claims", "check", str(path)])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "Traceback" not in result.output
    assert "cannot decide at level 0.00179 (Holm across 28): an exact test on 6 pairs" in said
    assert "it needs 10 pairs" in said
    body["min_seeds"] = 10
    path.write_text(yaml.safe_dump(body))
    assert CliRunner().invoke(app, ["claims", "check", str(path)]).exit_code == 0

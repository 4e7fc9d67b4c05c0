"""The claims registry's predicates on planted run directories, each verdict computed here by hand
(scipy): intervals, exact tests, equivalence, trends, steps to a target (rates and stable rates:
test_claim_stability.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml
from planted import pair, plant, t_interval, verdict_of, write_claim
from scipy import stats

from normbench.claims import output
from normbench.claims.predicates import judge
from normbench.claims.schema import parse_claim
from normbench.claims.verdicts import assess
from normbench.core.errors import ConfigError
from normbench.report.load import find_inputs, load_runs

# ----------------------------------------------------------------------------- better / worse


@pytest.mark.parametrize(
    "a, b, word",
    [
        ([1.90, 1.98, 1.96], [2.00, 2.10, 2.05], "reproduced"),
        ([2.10, 2.20, 2.16], [2.00, 2.10, 2.05], "not reproduced"),
        ([1.90, 2.18, 2.00], [2.00, 2.10, 2.05], "inconclusive"),
    ],
)
def test_better_reads_the_paired_t_interval(tmp_path, a, b, word):
    pair(tmp_path / "runs", a, b)
    claim = write_claim(tmp_path, "better_claim", kind="better", a={"norm": "rms"}, b={"norm": "ln"})
    out = verdict_of(tmp_path, claim, tmp_path / "runs")
    d = np.subtract(a, b)
    low, high = t_interval(d)
    assert out.verdict == word
    assert (out.estimate, out.low, out.high) == pytest.approx((d.mean(), low, high), abs=1e-12)
    assert (out.n_a, out.n_b) == (3, 3)
    if word == "inconclusive":
        assert "seeds per arm would settle it with 80% power" in out.reason


@pytest.mark.parametrize("effect, sides", [(0.5, 2), (1.0, 2), (0.7, 1)])
def test_the_seeds_suggested_have_80_percent_power_by_simulation(effect, sides):
    """The suggested n: a simulated paired t test (normal differences of mean ``effect``, sd 1) rejects
    in about 80% of 4,000 trials at n, and less at n - 4."""
    from normbench.claims.smallsample import seeds_needed

    n = int(seeds_needed(1.0, effect, 0.05, sides).split()[1])
    rng = np.random.default_rng(1)

    def rejects(k):
        d = rng.normal(effect, 1.0, size=(4000, k))
        t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(k))
        return np.mean(t > stats.t.ppf(1 - 0.05 / sides, k - 1))

    assert 0.77 < rejects(n) < 0.87 and rejects(n - 4) < 0.79


def test_better_each_arm_at_its_own_best_learning_rate(tmp_path):
    """rms is best at 0.03, ln at 0.01 (both inside the grid): the comparison is between those."""
    runs = tmp_path / "runs"
    for seed in range(3):
        for lr, rms, ln in ((0.003, 2.7, 2.3), (0.01, 2.5, 2.0), (0.03, 1.9, 2.6), (0.1, 2.8, 2.9)):
            plant(runs, f"rms_{lr}_s{seed}", seed=seed, norm="rms", lr=lr, final=rms + 0.02 * seed)
            plant(runs, f"ln_{lr}_s{seed}", seed=seed, norm="ln", lr=lr, final=ln + 0.01 * seed)
    claim = write_claim(
        tmp_path, "tuned", kind="better", a={"norm": "rms"}, b={"norm": "ln"}, tune="train.lr"
    )
    out = verdict_of(tmp_path, claim, runs)
    assert out.estimate == pytest.approx(np.mean([1.9 - 2.0, 1.92 - 2.01, 1.94 - 2.02]))
    assert out.verdict == "reproduced" and len(out.runs) == 6


def test_every_seed_of_an_arm_is_read_at_the_arms_one_best_value(tmp_path):
    """Seed 2 alone prefers lr 0.01 by a lucky 1.5; seeds 0 and 1 prefer 0.03. The arm's best value is
    the one with the lowest mean over all its seeds (0.01: 2.0 against 0.03: 2.1), and every seed is
    read there, its lucky seed included: the rule normbench report tunes by."""
    runs = tmp_path / "runs"
    a = {0.003: [2.9, 2.9, 2.9], 0.01: [2.2, 2.3, 1.5], 0.03: [2.0, 2.1, 2.2], 0.1: [3.0, 3.0, 3.0]}
    for lr, losses in a.items():
        for seed, loss in enumerate(losses):
            plant(runs, f"rms_{lr}_s{seed}", seed=seed, norm="rms", lr=lr, final=loss)
            plant(runs, f"ln_{lr}_s{seed}", seed=seed, norm="ln", lr=lr, final=2.5 if lr == 0.01 else 3.0)
    claim = write_claim(tmp_path, "one", kind="better", a={"norm": "rms"}, b={"norm": "ln"}, tune="train.lr")
    out = verdict_of(tmp_path, claim, runs)
    assert out.estimate == pytest.approx(np.mean([2.2, 2.3, 1.5]) - 2.5)
    assert "each arm at its best value over its seeds" in out.test


def test_a_best_value_at_the_grids_edge_is_inconclusive(tmp_path):
    """rms is best at the grid's largest rate: its best may lie beyond, so no verdict reads."""
    runs = tmp_path / "runs"
    for seed in range(3):
        for lr, rms, ln in ((0.01, 2.5, 2.0), (0.03, 1.9, 2.6), (0.003, 2.7, 2.3)):
            plant(runs, f"rms_{lr}_s{seed}", seed=seed, norm="rms", lr=0.1 if lr == 0.03 else lr, final=rms)
            plant(runs, f"ln_{lr}_s{seed}", seed=seed, norm="ln", lr=lr, final=ln + 0.01 * seed)
    claim = write_claim(tmp_path, "edge", kind="better", a={"norm": "rms"}, b={"norm": "ln"}, tune="train.lr")
    out = verdict_of(tmp_path, claim, runs)
    assert out.verdict == "inconclusive" and "a's best train.lr (0.1) is the grid's largest" in out.reason


@pytest.mark.parametrize("n, word", [(3, "inconclusive"), (5, "inconclusive"), (6, "reproduced")])
def test_identical_differences_read_by_the_exact_sign_flip_test(tmp_path, n, word):
    """Every seed 0.04 better: no spread, so no t interval; the sign-flip test's p is 2 / 2^n (hand
    count: only the all-plus and all-minus flips are as extreme), below 0.05 from 6 seeds."""
    b = [2.0 + 0.01 * s for s in range(n)]
    pair(tmp_path / "runs", [v - 0.04 for v in b], b)
    claim = write_claim(tmp_path, "same", kind="better", a={"norm": "rms"}, b={"norm": "ln"})
    out = verdict_of(tmp_path, claim, tmp_path / "runs")
    assert out.verdict == word and out.p == pytest.approx(2 / 2**n)
    assert math.isnan(out.low) and math.isnan(out.high)


def test_a_real_effect_of_0_04_over_seed_noise_0_006_reads_reproduced(tmp_path):
    rng = np.random.default_rng(0)
    b = 2.0 + rng.normal(0, 0.01, 5)
    a = b - 0.04 + rng.normal(0, 0.006, 5)
    pair(tmp_path / "runs", a, b)
    claim = write_claim(tmp_path, "real", kind="better", a={"norm": "rms"}, b={"norm": "ln"})
    out = verdict_of(tmp_path, claim, tmp_path / "runs")
    assert out.verdict == "reproduced" and out.high < 0


def test_log_compares_the_logs_of_a_metric_that_grows_by_factors(tmp_path):
    """Logit peaks of 10-20 against 500-5000: raw, the spread hides it; in logs the t interval excludes 0."""
    a, b = [12.0, 18.0, 10.0], [600.0, 4800.0, 900.0]
    pair(tmp_path / "runs", [2.0] * 3, [2.0] * 3)
    for seed, (la, lb) in enumerate(zip(a, b)):
        for norm, peak in (("rms", la), ("ln", lb)):
            path = tmp_path / "runs" / f"{norm}_s{seed}" / "summary.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), "max_attn_logit": peak}))
    for log, word in ((False, "inconclusive"), (True, "reproduced")):
        claim = write_claim(
            tmp_path, "logits", kind="better", a={"norm": "rms"}, b={"norm": "ln"}, metric="max_attn_logit"
        )
        body = yaml.safe_load(claim.read_text())
        body["compare"]["log"] = log
        claim.write_text(yaml.safe_dump(body))
        out = verdict_of(tmp_path, claim, tmp_path / "runs")
        d = np.log(a) - np.log(b) if log else np.subtract(a, b)
        assert out.verdict == word and (out.low, out.high) == pytest.approx(t_interval(d))


@pytest.mark.parametrize(
    "effect, word", [(0.05, "not reproduced"), (0.01, "inconclusive"), (None, "inconclusive")]
)
def test_equivalence_refutes_a_difference_only_under_the_claimed_effect(tmp_path, effect, word):
    """Equivalent within ±0.02: that refutes a claimed 0.05, not a claimed 0.01 (or an unsized one)."""
    pair(tmp_path / "runs", [2.001, 1.999, 2.0005], [2.0, 2.0, 2.0])
    extra = {"effect": effect} if effect is not None else {}
    claim = write_claim(
        tmp_path, "worse", kind="worse", a={"norm": "rms"}, b={"norm": "ln"}, delta=0.02, **extra
    )
    out = verdict_of(tmp_path, claim, tmp_path / "runs")
    assert out.verdict == word and "equivalent within ±0.02" in out.reason


def test_an_arm_with_several_runs_per_seed_names_the_key_that_splits_it(tmp_path):
    pair(tmp_path / "runs", [1.90, 1.98, 1.96], [2.0, 2.1, 2.05], model__n_layer=2)
    pair(tmp_path / "runs4", [1.80, 1.88, 1.86], [2.0, 2.1, 2.05], model__n_layer=4)
    claim = write_claim(tmp_path, "split", kind="better", a={"norm": "rms"}, b={"norm": "ln"})
    d = load_runs(find_inputs([tmp_path / "runs", tmp_path / "runs4"])[0], lambda m: None)
    out = judge(parse_claim(claim), d)
    assert out.verdict == "inconclusive" and "differing in model.n_layer: name it in compare.a" in out.reason


def test_fewer_than_min_seeds_gives_no_interval(tmp_path):
    pair(tmp_path / "runs", [1.9, 1.95], [2.0, 2.1])
    claim = write_claim(tmp_path, "few", kind="better", a={"norm": "rms"}, b={"norm": "ln"})
    out = verdict_of(tmp_path, claim, tmp_path / "runs")
    assert out.verdict == "inconclusive" and "fewer than min_seeds 3" in out.reason
    assert math.isnan(out.low) and math.isnan(out.high)


def test_a_higher_is_better_metric_turns_the_direction(tmp_path):
    runs = tmp_path / "runs"
    for seed, (sa, sb) in enumerate([(1200, 1000), (1250, 1010), (1190, 990)]):
        for norm, speed in (("rms", sa), ("ln", sb)):
            run = plant(runs, f"{norm}_s{seed}", seed=seed, final=2.0, norm=norm)
            summary = json.loads((run / "summary.json").read_text())
            (run / "summary.json").write_text(json.dumps({**summary, "tokens_per_s": speed}))
    claim = write_claim(
        tmp_path, "fast", kind="better", a={"norm": "rms"}, b={"norm": "ln"}, metric="tokens_per_s"
    )
    assert verdict_of(tmp_path, claim, runs).verdict == "reproduced"


# ----------------------------------------------------------------------------- equivalent / not_worse


def judged_pair(tmp_path, diffs, kind: str):
    """rms = ln + ``diffs`` per seed, judged by a ``kind`` claim with margin 0.02."""
    b = [2.0, 2.1, 2.05]
    pair(tmp_path / "runs", np.add(b, diffs), b)
    claim = write_claim(tmp_path, kind, kind=kind, a={"norm": "rms"}, b={"norm": "ln"}, delta=0.02)
    return verdict_of(tmp_path, claim, tmp_path / "runs")


@pytest.mark.parametrize(
    "diffs, word",
    [
        ([0.002, -0.003, 0.001], "reproduced"),
        ([0.10, 0.12, 0.11], "not reproduced"),
        ([0.03, -0.02, 0.01], "inconclusive"),
    ],
)
def test_equivalent_is_two_one_sided_tests(tmp_path, diffs, word):
    out = judged_pair(tmp_path, diffs, "equivalent")
    d = np.asarray(diffs)
    low, high = t_interval(d, 0.90)  # TOST at alpha 0.05 is the 90% interval inside ±delta
    se = stats.sem(d)
    inside = max(stats.t.sf((d.mean() + 0.02) / se, 2), stats.t.cdf((d.mean() - 0.02) / se, 2))
    outside = min(stats.t.sf((d.mean() - 0.02) / se, 2), stats.t.cdf((d.mean() + 0.02) / se, 2))
    p = min(inside, outside)  # the test that decides its word, either way (Holm orders by it)
    assert out.verdict == word
    assert (out.low, out.high, out.p) == pytest.approx((low, high, p), abs=1e-9)
    assert out.level.startswith("90%")


@pytest.mark.parametrize(
    "diffs, word",
    [
        ([-0.05, -0.02, -0.04], "reproduced"),
        ([0.10, 0.12, 0.11], "not reproduced"),
        ([0.03, -0.02, 0.01], "inconclusive"),
    ],
)
def test_not_worse_bounds_the_unfavourable_end(tmp_path, diffs, word):
    """One-sided at 0.05: its bound is the 90% interval's upper end, and its p agrees with it."""
    out = judged_pair(tmp_path, diffs, "not_worse")
    low, high = t_interval(diffs, 0.90)
    d = np.asarray(diffs)
    claimed = stats.t.cdf((d.mean() - 0.02) / stats.sem(d), 2)  # worse by less than 0.02
    other = stats.t.sf((d.mean() - 0.02) / stats.sem(d), 2)  # worse by more
    p = min(claimed, other)
    assert out.verdict == word and (out.low, out.high, out.p) == pytest.approx((low, high, p), abs=1e-12)
    assert (high < 0.02) == (word == "reproduced") == (claimed < 0.05)
    assert (low > 0.02) == (word == "not reproduced")


# ----------------------------------------------------------------------------- trend


def plant_depths(root, gaps):
    """post - pre = gaps[size] + the same seed noise at every size (the slope is the planted one)."""
    noise = [0.0, 0.01, -0.01]
    for size, gap in gaps.items():
        for seed in range(3):
            pre = 2.0 + 0.02 * seed
            plant(root, f"pre_{size}_s{seed}", seed=seed, placement="pre", final=pre, model__n_layer=size)
            post = pre + gap + noise[seed]
            plant(root, f"post_{size}_s{seed}", seed=seed, placement="post", final=post, model__n_layer=size)


def post_gap_grows_with_depth(tmp_path):
    """A trend claim: Post-LN's gap to Pre-LN grows with model.n_layer."""
    return write_claim(
        tmp_path,
        "deeper",
        kind="trend",
        a={"placement": "post"},
        b={"placement": "pre"},
        axis="model.n_layer",
        of="gap",
        direction="increasing",
    )


@pytest.mark.parametrize(
    "gaps, word",
    [
        ({2: 0.01, 4: 0.05, 8: 0.10}, "reproduced"),
        ({2: 0.10, 4: 0.05, 8: 0.01}, "not reproduced"),
        ({2: 0.01, 4: 0.05, 8: 0.0}, "inconclusive"),
    ],
)
def test_trend_of_the_gap_is_the_slope_per_doubling(tmp_path, gaps, word):
    plant_depths(tmp_path / "runs", gaps)
    out = verdict_of(tmp_path, post_gap_grows_with_depth(tmp_path), tmp_path / "runs")
    slope = np.polyfit(np.log2(list(gaps)), list(gaps.values()), 1)[0]
    assert out.verdict == word and out.estimate == pytest.approx(slope, abs=1e-12)
    assert out.low < slope < out.high


def test_a_gap_that_does_not_grow_at_every_step_is_not_read_as_growing(tmp_path):
    """Gaps zigzag 0, 0.3, 0, 0.3 over four depths, each size's seeds within 0.01: the least-squares slope is
    positive, but from 4 to 8 layers the gap falls by 0.3 (a Welch t test of one size against the next, by
    hand), so "grows with depth" is not read off the slope."""
    gaps = {2: 0.0, 4: 0.3, 8: 0.0, 16: 0.3}
    plant_depths(tmp_path / "runs", gaps)
    out = verdict_of(tmp_path, post_gap_grows_with_depth(tmp_path), tmp_path / "runs")
    t, g = np.log2(list(gaps)), np.array(list(gaps.values()))
    slope = np.polyfit(t, g, 1)[0]
    assert slope > 0 and out.estimate == pytest.approx(slope)
    assert out.verdict == "inconclusive"
    assert "it is not increasing at every step: from model.n_layer=4 to 8 it moves -0.3" in out.reason


def test_a_gap_that_grows_at_every_step_but_not_along_a_line_is_reproduced(tmp_path):
    """Gaps 0.01, 0.02, 0.20 (growing faster than a line in log2 depth, each size's seeds within 0.01): every
    step between adjacent depths rises beyond its seeds' noise, the largest step p of the two (hand-computed
    Welch t tests) is the verdict's p."""
    gaps = {2: 0.01, 4: 0.05, 8: 0.30}
    plant_depths(tmp_path / "runs", gaps)
    out = verdict_of(tmp_path, post_gap_grows_with_depth(tmp_path), tmp_path / "runs")
    se = np.std([0.0, 0.01, -0.01], ddof=1) / math.sqrt(3)  # each size's gap: 3 seeds, a - b paired
    steps = np.diff(list(gaps.values()))
    assert out.verdict == "reproduced", out.reason
    # Welch's degrees of freedom for two sizes of equal SE on 2 each: (2 se^2)^2 / (2 se^4 / 2) = 4
    assert out.p == pytest.approx(max(2 * stats.t.sf(step / math.hypot(se, se), 4) for step in steps))


def test_a_trend_needs_two_sizes_with_min_seeds(tmp_path):
    plant_depths(tmp_path / "runs", {2: 0.01})
    out = verdict_of(tmp_path, post_gap_grows_with_depth(tmp_path), tmp_path / "runs")
    assert out.verdict == "inconclusive" and "a trend needs 2" in out.reason


def plant_best_values(runs, param, moves, seeds):
    """Per seed the best learning rate at each width: constant or x4 per doubling (slope 2 in log2)."""
    grid = [0.000625, 0.0025, 0.01, 0.04, 0.16, 0.64]
    for i, width in enumerate((32, 64, 128)):
        best = grid[1 + i] if moves else grid[2]
        for seed in range(seeds):
            for lr in grid:
                plant(
                    runs,
                    f"{param}_w{width}_lr{lr}_s{seed}",
                    seed=seed,
                    lr=lr,
                    final=2.0 + abs(math.log2(lr / best)) + 0.01 * seed,
                    model__d_model=width,
                    model__param=param,
                )


def transfer_claim(tmp_path, b):
    return write_claim(
        tmp_path,
        "mup",
        kind="trend",
        a={"model.param": "mup"},
        b=b,
        tune="train.lr",
        axis="model.d_model",
        of="best_value",
        direction="flat",
        delta=0.5,
    )


@pytest.mark.parametrize(
    "a_moves, b_moves, word",
    [(False, True, "reproduced"), (False, False, "inconclusive"), (True, True, "not reproduced")],
)
def test_a_flat_best_value_needs_its_control_to_move(tmp_path, a_moves, b_moves, word):
    """μP (a) against SP (b), 6 seeds: a flat μP line reads reproduced only beside an SP line that the
    same grid sees move."""
    runs = tmp_path / "runs"
    plant_best_values(runs, "mup", a_moves, 6)
    plant_best_values(runs, "sp", b_moves, 6)
    out = verdict_of(tmp_path, transfer_claim(tmp_path, {"model.param": "sp"}), runs)
    assert out.verdict == word and out.estimate == pytest.approx(2.0 if a_moves else 0.0, abs=1e-12)
    if word == "inconclusive":
        assert "control b's slope" in out.reason


def test_a_best_value_read_off_a_grid_carries_its_rounding(tmp_path):
    """Three seeds, all at the same best rate at every width: the spread is 0, but the grid's step (2
    in log2) carries 2 / sqrt(12) per seed, so the slope's 90% interval is not a point: hand-computed
    from three sizes at log2 widths 5, 6, 7 (the slope's variance: 2 x (1/2)^2 x se^2 per size)."""
    runs = tmp_path / "runs"
    plant_best_values(runs, "mup", False, 3)
    out = verdict_of(tmp_path, transfer_claim(tmp_path, None), runs)
    se_size = 2 / math.sqrt(12) / math.sqrt(3)
    se_slope = math.sqrt(2 * 0.25 * se_size**2)
    df = (2 * 0.25 * se_size**2) ** 2 / (2 * (0.25 * se_size**2) ** 2 / 2)
    half = stats.t.ppf(0.95, df) * se_slope
    assert (out.low, out.high) == pytest.approx((-half, half))
    assert out.verdict == ("reproduced" if half < 0.5 else "inconclusive")


# ----------------------------------------------------------------------------- steps to target


def plant_speeds(runs, a_rates, b_rates, a_floor=0.0):
    """Curves 3 - rate * step / 100 (evaluated every 10 steps to 100), never below ``a_floor`` for a."""
    for seed, (ra, rb) in enumerate(zip(a_rates, b_rates)):
        steps = range(10, 101, 10)
        a_curve = {s: max(3.0 - ra * s / 100, a_floor) for s in steps}
        b_curve = {s: 3.0 - rb * s / 100 for s in steps}
        plant(runs, f"rms_s{seed}", seed=seed, norm="rms", final=a_curve[100], curve=a_curve)
        plant(runs, f"ln_s{seed}", seed=seed, norm="ln", final=b_curve[100], curve=b_curve)


def first_step(rate, target, floor=0.0):
    """The first evaluated step of 3 - rate * s / 100 at or below ``target`` (None: never)."""
    return next((s for s in range(10, 101, 10) if max(3.0 - rate * s / 100, floor) <= target + 1e-12), None)


@pytest.mark.parametrize(
    "a_rates, word",
    [
        ([2.0, 2.2, 2.1, 1.9, 2.3, 2.0], "reproduced"),
        ([0.5, 0.55, 0.5, 0.6, 0.5, 0.55], "not reproduced"),  # a never reaches b's final loss
        ([2.0, 2.2, 2.1], "inconclusive"),  # 3 seeds: fewer than the 6 an exact test needs
    ],
)
def test_steps_to_target_counts_steps_to_the_baselines_final_loss(tmp_path, a_rates, word):
    """The target of each seed is its baseline's final loss (3 - rate_b on the hand-made curves): b
    reaches it at its last step, a at the first evaluation at or below it, hand-counted; an a that never
    reaches it is read one evaluation past its last step (110), a lower bound."""
    b_rates = [1.0, 1.05, 0.95, 1.0, 1.1, 0.9][: len(a_rates)]
    plant_speeds(tmp_path / "runs", a_rates, b_rates)
    claim = write_claim(
        tmp_path, "steps", kind="steps_to_target", a={"norm": "rms"}, b={"norm": "ln"}, below=1.0
    )
    out = verdict_of(tmp_path, claim, tmp_path / "runs")
    if len(a_rates) < 6:
        assert out.verdict == word and "fewer than min_seeds 6" in out.reason
        return
    targets = [3.0 - rb for rb in b_rates]
    steps_a = [first_step(ra, t) or 110 for ra, t in zip(a_rates, targets)]
    steps_b = [first_step(rb, t) for rb, t in zip(b_rates, targets)]
    assert steps_b == [100] * 6
    logs = [math.log(sa / sb) for sa, sb in zip(steps_a, steps_b)]
    assert out.verdict == word and out.estimate == pytest.approx(math.exp(np.mean(logs)))
    if word == "reproduced":  # 3 - 2.0 s / 100 <= 2.0 first at s = 50: half the baseline's steps
        assert steps_a[0] == 50


def test_a_run_that_never_reaches_the_target_is_censored(tmp_path):
    """a is fast but three of its six seeds stall above the target: their steps are lower bounds, so
    a cannot read faster."""
    runs = tmp_path / "runs"
    plant_speeds(runs, [2.0] * 6, [1.0, 1.05, 0.95, 1.0, 1.1, 0.9])
    for seed in range(3):  # stalled at 2.8
        path = runs / f"rms_s{seed}" / "metrics.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**r, "val_loss": max(r["val_loss"], 2.8)}) + "\n" for r in rows))
    claim = write_claim(
        tmp_path, "steps", kind="steps_to_target", a={"norm": "rms"}, b={"norm": "ln"}, below=1.0
    )
    out = verdict_of(tmp_path, claim, runs)
    assert out.verdict == "inconclusive" and "3 run(s) of a never reached it" in out.reason
    assert out.unit.endswith("censored: at least this (a lower bound)")  # the ratio is not an estimate


def test_a_difference_the_other_way_at_the_grids_edge_is_inconclusive(tmp_path):
    """rms is clearly worse, but both arms are best at the grid's largest rate: beyond it either could
    gain more, so the verdict says what this grid reads and stays inconclusive."""
    runs = tmp_path / "runs"
    for seed in range(3):
        for lr, rms, ln in (
            (0.003, 2.9, 2.8),
            (0.01, 2.7, 2.5),
            (0.03, 2.4 + 0.01 * seed, 2.2 + 0.02 * seed),
        ):
            plant(runs, f"rms_{lr}_s{seed}", seed=seed, norm="rms", lr=lr, final=rms)
            plant(runs, f"ln_{lr}_s{seed}", seed=seed, norm="ln", lr=lr, final=ln)
    claim = write_claim(
        tmp_path, "edge2", kind="better", a={"norm": "rms"}, b={"norm": "ln"}, tune="train.lr"
    )
    out = verdict_of(tmp_path, claim, runs)
    assert out.verdict == "inconclusive"
    assert "is the grid's largest" in out.reason and "on this grid it would read not reproduced" in out.reason


def test_a_claims_note_on_what_changed_reaches_its_row(tmp_path):
    path = write_claim(tmp_path, "noted", kind="better", a={"norm": "rms"}, b={"norm": "ln"})
    body = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**body, "note": "was not reproduced:  the arm did not learn"}))
    pair(tmp_path / "claims" / "noted", [1.90, 1.98, 1.96], [2.0, 2.1, 2.05])
    frame = output.rows([assess(parse_claim(path), tmp_path / "claims" / "noted")], tmp_path)
    assert frame.loc[0, "changed"] == "was not reproduced: the arm did not learn"
    assert "claims.csv's changed column" in output.markdown(frame)
    body["note"] = 3
    path.write_text(yaml.safe_dump(body))
    with pytest.raises(ConfigError, match="note: must be null or text"):
        parse_claim(path)


def test_an_estimate_beyond_the_margin_says_how_many_seeds_would_show_it_beyond():
    """Equivalence claimed, a - b of about 0.05 against a margin of 0.02, too noisy to call: the seeds
    that would show it beyond the margin (80% power for 0.05 - 0.02), not 'no seed count'."""
    from normbench.claims.smallsample import power, seeds_needed

    said = seeds_needed(0.03, 0.05 - 0.02, 0.05, sides=1)
    n = int(said.split()[1])
    assert power(n, 1.0, 0.05, 1) >= 0.8 > power(n - 1, 1.0, 0.05, 1)


def test_equivalence_beyond_its_margin_but_noisy_is_inconclusive_with_a_seed_count(tmp_path):
    out = judged_pair(tmp_path, [0.05, 0.00, 0.10], "equivalent")
    assert out.verdict == "inconclusive" and "seeds per arm would settle it" in out.reason


def test_lr_sensitivity_is_wortsmans_per_seed_and_a_diverged_run_counts_as_its_init(tmp_path):
    """Each seed's LR sensitivity (Wortsman et al. 2023, §2.2), by hand: the mean over the grid of
    min(final loss, loss at init 4.0) minus its smallest value, a diverged run read at init. The treated
    arm learns at every rate; the baseline diverges at the two highest: it is the more sensitive."""
    runs = tmp_path / "runs"
    grid = (0.01, 0.03, 0.1, 0.3)
    sensitivity = {"rms": [], "ln": []}
    for seed in range(3):
        treated = {0.01: 2.6, 0.03: 2.4, 0.1: 2.5, 0.3: 2.9 + 0.03 * seed}
        baseline = {0.01: 2.6, 0.03: 2.45 - 0.01 * seed, 0.1: None, 0.3: None}  # None: diverged
        for lr in grid:
            plant(runs, f"rms_{lr}_s{seed}", seed=seed, norm="rms", lr=lr, final=treated[lr])
            loss = baseline[lr]
            status = "completed" if loss is not None else "diverged"
            plant(runs, f"ln_{lr}_s{seed}", seed=seed, norm="ln", lr=lr, final=loss or 9.9, status=status)
        capped = [min(v, 4.0) if v is not None else 4.0 for v in baseline.values()]
        sensitivity["rms"].append(np.mean(list(treated.values())) - min(treated.values()))
        sensitivity["ln"].append(np.mean(capped) - min(capped))
    claim = write_claim(
        tmp_path,
        "calm",
        kind="better",
        a={"norm": "rms"},
        b={"norm": "ln"},
        tune="train.lr",
        metric="lr_sensitivity",
    )
    out = verdict_of(tmp_path, claim, runs)
    diffs = np.subtract(sensitivity["rms"], sensitivity["ln"])
    assert out.estimate == pytest.approx(diffs.mean())
    assert out.verdict == "reproduced" and out.unit == "lr_sensitivity: a - b"
    assert "sensitivity over its train.lr grid" in out.test


def test_lr_sensitivity_needs_the_grid_it_is_read_over(tmp_path):
    path = write_claim(
        tmp_path, "calm", kind="better", a={"norm": "rms"}, b={"norm": "ln"}, metric="lr_sensitivity"
    )
    with pytest.raises(ConfigError, match="compare.tune: lr_sensitivity is read over the grid"):
        parse_claim(path)

"""The claims registry on planted run directories whose verdicts are computed here by hand (scipy)."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import run_cli, train_tiny
from scipy import stats
from typer.testing import CliRunner

from normbench.claims import output
from normbench.claims.predicates import judge
from normbench.claims.schema import ARXIV, METRIC_NAMES, load_registry, parse_claim
from normbench.claims.verdicts import assess, assess_all
from normbench.cli import app
from normbench.core import provenance
from normbench.core.configtree import conf_dir
from normbench.core.errors import ConfigError
from normbench.report.load import find_inputs, load_runs

PROVENANCE = {
    "commit": "abc1234",
    "dirty": False,
    "torch": "2.13.0+cpu",
    "device": "cpu",
    "numerics": provenance.NUMERICS,
    "date": "2026-11-20",
}


def plant(
    root,
    name,
    *,
    seed,
    final,
    norm="ln",
    placement="pre",
    lr=0.01,
    status="completed",
    curve=None,
    params=1000,
    provenance=PROVENANCE,
    **config,
):
    """A run directory as training leaves it: config.yaml, metrics.jsonl (step-0 eval, then ``curve``:
    {step: val_loss}, ending at ``final`` by default) and summary.json. ``config``: dotted keys."""
    run = root / name
    run.mkdir(parents=True)
    cfg = {
        "seed": seed,
        "norm": {"name": norm},
        "placement": {"name": placement},
        "model": {"n_layer": 2, "d_model": 64},
        "train": {"lr": lr, "steps": 100, "warmup_steps": 10},
    }
    for key, value in config.items():
        group, leaf = key.split("__")
        cfg.setdefault(group, {})[leaf] = value
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    curve = curve or {50: final + 0.5, 100: final}
    evals = [{"kind": "eval", "step": 0, "val_loss": 4.0}]
    evals += [{"kind": "eval", "step": s, "val_loss": v} for s, v in curve.items()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    summary = {
        "status": status,
        "final_val_loss": final if status == "completed" else None,
        "params": params,
        "tokens_per_s": 1000.0,
    }
    if provenance is not None:
        summary["provenance"] = provenance
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def write_claim(folder, cid, *, kind, a, b, tune=None, metric="final_val_loss", min_seeds=None, **predicate):
    """A user's claim YAML in FOLDER/claim/CID.yaml; returns its path."""
    body = {
        "id": cid,
        "claim": f"{cid} holds.",
        "source": {
            "kind": "paper",
            "authors": "Ada Lovelace, Charles Babbage",
            "year": 2020,
            "arxiv": "2001.00001",
            "title": "A planted claim",
            "setting": "1.3B parameters",
        },
        "sweep": {"experiment": None, "overrides": ["norm=ln,rms", "seed=0,1,2"]},
        "compare": {"a": a, "b": b, "metric": metric, "tune": tune},
        "predicate": {"kind": kind, **predicate},
        "scale": {"model": "mini", "why": "the default model, as the sweep composes it."},
        "min_seeds": min_seeds or (6 if kind in ("steps_to_target", "stable_lr") else 3),
        "scale_dependent": "1.3B parameters",
    }
    path = folder / "claim" / f"{cid}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def verdict_of(tmp_path, claim_path, runs):
    d = load_runs(find_inputs([runs])[0], lambda m: None)
    return judge(parse_claim(claim_path), d)


def t_interval(d, confidence=0.95):
    d = np.asarray(d, float)
    return stats.t.interval(confidence, len(d) - 1, loc=d.mean(), scale=stats.sem(d))


def pair(root, a_losses, b_losses, a_norm="rms", b_norm="ln", **kw):
    """Planted rms (a) and ln (b) runs over seeds 0.. at one learning rate."""
    for seed, (la, lb) in enumerate(zip(a_losses, b_losses)):
        plant(root, f"{a_norm}_s{seed}", seed=seed, final=la, norm=a_norm, **kw)
        plant(root, f"{b_norm}_s{seed}", seed=seed, final=lb, norm=b_norm, **kw)


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


def test_each_seed_is_read_at_the_value_its_other_seeds_chose(tmp_path):
    """Seed 2 alone prefers lr 0.01 (a lucky 1.5); seeds 0 and 1 prefer 0.03. Chosen on all seeds the
    arm would take each seed's best; chosen on the others, seed 2 is read at 0.03 and seeds 0, 1 at
    the value the other two prefer by their mean (hand-computed below)."""
    runs = tmp_path / "runs"
    a = {0.003: [2.9, 2.9, 2.9], 0.01: [2.2, 2.3, 1.5], 0.03: [2.0, 2.1, 2.2], 0.1: [3.0, 3.0, 3.0]}
    for lr, losses in a.items():
        for seed, loss in enumerate(losses):
            plant(runs, f"rms_{lr}_s{seed}", seed=seed, norm="rms", lr=lr, final=loss)
            plant(runs, f"ln_{lr}_s{seed}", seed=seed, norm="ln", lr=lr, final=2.5 if lr == 0.01 else 3.0)
    claim = write_claim(tmp_path, "loo", kind="better", a={"norm": "rms"}, b={"norm": "ln"}, tune="train.lr")
    out = verdict_of(tmp_path, claim, runs)
    # seed 0: others (1, 2) at 0.01 mean 1.9, at 0.03 mean 2.15 -> 0.01 -> 2.2
    # seed 1: others (0, 2) at 0.01 mean 1.85, at 0.03 2.1 -> 0.01 -> 2.3
    # seed 2: others (0, 1) at 0.01 mean 2.25, at 0.03 2.05 -> 0.03 -> 2.2
    assert out.estimate == pytest.approx(np.mean([2.2, 2.3, 2.2]) - 2.5)
    assert "chosen on the arm's other seeds" in out.test


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
        ([0.5, 0.55, 0.5, 0.6, 0.5, 0.55], "not reproduced"),
        ([2.0, 2.2, 2.1], "inconclusive"),  # 3 seeds: fewer than the 6 an exact test needs
    ],
)
def test_steps_to_target_a_target_both_curves_cross(tmp_path, a_rates, word):
    """The target is the higher of the arms' mean losses at step 50 (mid-run), so both arms reach it
    well before their end; the ratio per seed is hand-counted from the curves."""
    b_rates = [1.0, 1.05, 0.95, 1.0, 1.1, 0.9][: len(a_rates)]
    plant_speeds(tmp_path / "runs", a_rates, b_rates)
    claim = write_claim(
        tmp_path, "steps", kind="steps_to_target", a={"norm": "rms"}, b={"norm": "ln"}, below=1.0
    )
    out = verdict_of(tmp_path, claim, tmp_path / "runs")
    target = max(np.mean([3.0 - r * 0.5 for r in rates]) for rates in (a_rates, b_rates))
    logs = [math.log(first_step(ra, target) / first_step(rb, target)) for ra, rb in zip(a_rates, b_rates)]
    if len(a_rates) < 6:
        assert out.verdict == word and "fewer than min_seeds 6" in out.reason
        return
    assert out.verdict == word and out.estimate == pytest.approx(math.exp(np.mean(logs)))


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


def stable_claim(tmp_path):
    return write_claim(
        tmp_path,
        "stable",
        kind="stable_lr",
        a={"norm": "rms"},
        b={"norm": "ln"},
        tune="train.lr",
        factor=1.41,
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
    assert "claims reproduced at this scale" in (tmp_path / "claims" / "claims.md").read_text()
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


def test_check_accepts_every_shipped_claim():
    """Each claim's sweep composes, job by job, and holds both its arms, its tuned key and its scale."""
    for c in load_registry():
        result = cli("claims", "check", str(c.path))
        assert result.exit_code == 0 and result.output.startswith(f"ok: {c.id}"), result.output
        assert f"{c.runs()} runs in its default sweep, at model={c.scale['model']}" in result.output


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
    assert "scale.model: 'huge' is not a model size; allowed: micro, mini" in refused(
        tmp_path, lambda b: b["scale"].update(model="huge")
    )


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
    assert articles and all(c.scale["model"] in ("mini", "small") for c in articles), [
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
    report_only = {"floor_gap"}  # the report computes it: final_val_loss - floor_loss
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
    for column in output.COLUMNS:
        a, b = fresh[column], stored[column]
        if pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(b):
            assert np.allclose(a, b, rtol=1e-9, atol=0, equal_nan=True), column
        else:
            assert list(a.fillna("").astype(str)) == list(b.fillna("").astype(str)), column


@pytest.mark.parametrize("page", ["results/claims/claims.md", "docs/claims.md"])
def test_the_committed_pages_are_the_commands_output(page):
    """docs/claims.md and the registry's own page: normbench claims report --markdown of the committed CSV,
    not a hand-edited number."""
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
    first = run_cli(*args, cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
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
    row = pd.read_csv(tmp_path / "claims" / "claims.csv").set_index("id").loc["tiny_claim"]
    assert (row["n_a"], row["n_b"]) == (1, 1) and row["verdict"] == "inconclusive"
    assert "fewer than min_seeds 3" in row["reason"]


def test_a_claims_sweep_is_its_own_then_the_users_overrides_into_its_folder(tmp_path):
    from normbench.claims.running import sweep_args

    (claim,) = [c for c in load_registry() if c.id == "rms_matches_ln_quality"]
    args = sweep_args(claim, ["train.steps=3", "placement=post"], tmp_path, config_dir=tmp_path)
    assert args == [
        "experiment=lr_sensitivity",
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


def test_a_claims_note_on_what_changed_reaches_its_row_and_the_page(tmp_path):
    path = write_claim(tmp_path, "noted", kind="better", a={"norm": "rms"}, b={"norm": "ln"})
    body = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**body, "note": "was not reproduced:  the arm did not learn"}))
    pair(tmp_path / "claims" / "noted", [1.90, 1.98, 1.96], [2.0, 2.1, 2.05])
    frame = output.rows([assess(parse_claim(path), tmp_path / "claims" / "noted")], tmp_path)
    assert frame.loc[0, "changed"] == "was not reproduced: the arm did not learn"
    assert "*Changed:* was not reproduced: the arm did not learn" in output.markdown(frame)
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

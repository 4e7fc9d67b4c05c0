"""A claim and ``normbench report`` read the same runs one way: each arm at one best value chosen by
one rule, a seed that diverged there ranked worst, a failed run left out and named, and a verdict
that differs from the report's reading says why. Every expected number is computed here by hand
from the planted losses."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from planted import plant, t_interval, verdict_of, write_claim
from test_report import only_charts, report

from normbench.claims.predicates import judge
from normbench.claims.schema import parse_claim
from normbench.claims.telling import verdict_line
from normbench.claims.verdicts import assess
from normbench.report.load import find_inputs, load_runs

RATES = (0.003, 0.01, 0.03, 0.1)
LN = {0.003: [2.30] * 4, 0.01: [2.00, 2.01, 1.99, 2.02], 0.03: [2.20] * 4, 0.1: [2.50] * 4}
DIVERGED = None  # a seed that diverged (planted at a loss at init of 4.0)


def plant_arms(root, rms: dict, ln: dict = LN, failed=()) -> None:
    """rms (the user's norm, a) and ln (b) at every rate and seed; ``None`` losses diverged; (rate,
    seed) in ``failed`` crashed."""
    for arm, losses in (("rms", rms), ("ln", ln)):
        for lr, per_seed in losses.items():
            for seed, final in enumerate(per_seed):
                status = "diverged" if final is None else "completed"
                if (arm, lr, seed) in failed:
                    status = "failed"
                loss = 4.0 if final is None else final
                plant(root, f"{arm}_{lr:g}_s{seed}", seed=seed, final=loss, norm=arm, lr=lr, status=status)


def better_claim(tmp_path):
    return write_claim(
        tmp_path / "conf", "mine", kind="better", a={"norm": "rms"}, b={"norm": "ln"}, tune="train.lr"
    )


def tuned(tmp_path, monkeypatch, runs) -> pd.DataFrame:
    only_charts(monkeypatch)
    out, _ = report([runs], out=tmp_path / "report")
    return pd.read_csv(out / "tuned.csv").set_index("norm")


def test_a_seed_diverged_where_its_arms_other_seeds_did_best_leaves_a_consistent_effect_decided(
    tmp_path, monkeypatch
):
    """rms is worse than ln at every seed and rate; its seed 0 diverged at 0.01, where its other seeds
    did best. Every seed counting (the diverged one at its loss at init, 4.0), rms's best rate is 0.03
    (mean 2.5025 against (4.0 + 2.30 + 2.31 + 2.29) / 4 = 2.725), every seed is read there, and the
    difference to ln at its 0.01 excludes 0: rms is worse, as the report reads it too."""
    runs = tmp_path / "runs"
    rms = {0.003: [2.8] * 4, 0.01: [DIVERGED, 2.30, 2.31, 2.29], 0.03: [2.50, 2.52, 2.48, 2.51]}
    rms[0.1] = [2.9] * 4
    plant_arms(runs, rms)
    out = verdict_of(tmp_path, better_claim(tmp_path), runs)
    d = np.subtract(rms[0.03], LN[0.01])
    low, high = t_interval(d)
    assert out.estimate == pytest.approx(d.mean()) and (out.low, out.high) == pytest.approx((low, high))
    assert low > 0 and out.verdict == "not reproduced" and (out.n_a, out.n_b) == (4, 4)
    t = tuned(tmp_path, monkeypatch, runs)
    assert (t.at["rms", "best_value"], t.at["ln", "best_value"]) == pytest.approx((0.03, 0.01))
    assert t.at["rms", "vs_best"] == "worse"
    assert t.at["rms", "diff_vs_best"] == pytest.approx(d.mean())


def test_a_seed_diverged_at_its_arms_value_is_ranked_with_the_arms_worst_seed_there(tmp_path, monkeypatch):
    """rms's best rate is 0.01 even with seed 0 diverged there ((4.0 + 2.30 + 2.31 + 2.29) / 4 = 2.725
    against 2.9 elsewhere). Seed 0 is read as rms's worst completed seed at 0.01, 2.31: evidence rms is
    worse, never a loss at init whose spread would make the effect inconclusive. The report reads the
    seeds there the same way."""
    runs = tmp_path / "runs"
    rms = {0.003: [2.9] * 4, 0.01: [DIVERGED, 2.30, 2.31, 2.29], 0.03: [2.9] * 4, 0.1: [3.0] * 4}
    plant_arms(runs, rms)
    out = verdict_of(tmp_path, better_claim(tmp_path), runs)
    d = np.subtract([2.31, 2.30, 2.31, 2.29], LN[0.01])
    low, high = t_interval(d)
    assert out.estimate == pytest.approx(d.mean()) and (out.low, out.high) == pytest.approx((low, high))
    assert low > 0 and out.verdict == "not reproduced" and out.n_a == 4
    t = tuned(tmp_path, monkeypatch, runs)
    assert t.at["rms", "best_value"] == pytest.approx(0.01)
    assert t.at["rms", "diff_vs_best"] == pytest.approx(d.mean())
    assert t.at["rms", "diff_ci_low"] == pytest.approx(low)


def test_a_failed_run_is_left_out_of_every_mean_and_choice_and_named(tmp_path, monkeypatch):
    """rms's seed 0 crashed at 0.01: an error, not a loss. Left out, rms's best rate is 0.01 (mean of
    2.30, 2.31, 2.29 against 2.40 at 0.03), read on its three other seeds; the claim and the report say
    the run failed and how to run it again."""
    runs = tmp_path / "runs"
    rms = {0.003: [2.9] * 4, 0.01: [2.30] * 4, 0.03: [2.40] * 4, 0.1: [3.0] * 4}
    rms[0.01] = [2.30, 2.30, 2.31, 2.29]
    plant_arms(runs, rms, failed={("rms", 0.01, 0)})
    out = verdict_of(tmp_path, better_claim(tmp_path), runs)
    assert out.estimate == pytest.approx(np.mean([2.30, 2.31, 2.29]) - np.mean(LN[0.01]))
    assert (out.n_a, out.n_b) == (3, 4)
    rerun = "normbench claims run mine --retry-failed"
    assert f"1 run failed (not counted): re-run them with {rerun}" in out.reason
    only_charts(monkeypatch)
    out_dir, _ = report([runs], out=tmp_path / "report")
    t = pd.read_csv(out_dir / "tuned.csv").set_index("norm")
    assert t.at["rms", "best_value"] == pytest.approx(0.01) and t.at["rms", "n_seeds"] == 3
    summary = " ".join((out_dir / "summary.md").read_text().split())
    rerun = "the same normbench sweep command and --retry-failed"
    assert f"1 run failed (not counted): re-run them with {rerun}" in summary


def test_a_verdict_stricter_than_the_reports_reading_says_why(tmp_path):
    """At its family's level (Holm across 27 claims: 0.05 / 27) the claim's interval of a - b includes
    0 where the report's 95% interval of the same differences excludes it: the verdict says both."""
    runs = tmp_path / "runs"
    a, b = [2.10, 2.08, 2.13], [2.00, 2.01, 2.02]
    for seed, (la, lb) in enumerate(zip(a, b)):
        plant(runs, f"rms_s{seed}", seed=seed, final=la, norm="rms")
        plant(runs, f"ln_s{seed}", seed=seed, final=lb, norm="ln")
    path = write_claim(tmp_path / "conf", "mine", kind="better", a={"norm": "rms"}, b={"norm": "ln"})
    claim = parse_claim(path)
    d = np.subtract(a, b)
    low95, high95 = t_interval(d)
    strict = t_interval(d, 1 - 0.05 / 27)
    assert low95 > 0 and strict[0] < 0  # the hand computation: the two levels read differently
    data = load_runs(find_inputs([runs])[0], lambda m: None)
    out = judge(claim, data, 0.05 / 27)
    assert out.verdict == "inconclusive"
    assert (
        f"normbench report reads a difference in these runs (its 95% interval of a - b, "
        f"[{low95:+.3g}, {high95:+.3g}], excludes 0); at this claim's level, 99.8% (its family's), "
        f"the interval [{strict[0]:+.3g}, {strict[1]:+.3g}] includes 0"
    ) in out.reason


def test_a_completed_run_that_learned_nothing_is_flagged_in_the_tables_and_verdicts(tmp_path, monkeypatch):
    """Post-LN's seed 1 completed at 3.7 from a loss at init of 4.0: 3.7 >= 0.9 x 4.0 = 3.6, it learned
    nothing; its seeds 0 and 2 (3.5 and 2.4) did. The report's table and verdict, and a claim that
    reads the run, say so, naming the arm; nothing is flagged for Pre-LN."""
    runs = tmp_path / "runs"
    for seed, (pre, post) in enumerate(zip([2.0, 2.1, 2.2], [3.5, 3.7, 2.4])):
        plant(runs, f"pre_s{seed}", seed=seed, final=pre, placement="pre")
        plant(runs, f"post_s{seed}", seed=seed, final=post, placement="post")
    only_charts(monkeypatch)
    out, _ = report([runs], out=tmp_path / "report")
    agg = pd.read_csv(out / "aggregate.csv").set_index("placement")
    assert (agg.at["post", "did_not_learn"], agg.at["pre", "did_not_learn"]) == (1, 0)
    text = (out / "summary.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| placement | runs |"))
    assert header.endswith("| diverged | failed | did not learn |")
    assert (
        "Did not learn (completed, its final validation loss at or above 90% of its loss at init, "
        "or less than 0.1 below its unigram loss): "
        "post (1/3 runs)."
    ) in " ".join(text.split())
    path = write_claim(
        tmp_path / "conf", "post", kind="better", a={"placement": "pre"}, b={"placement": "post"}, min_seeds=3
    )
    out = verdict_of(tmp_path, path, runs)
    said = (
        "1 of its runs did not learn (placement=post: 1 of 3; ended at or above 90% of their loss at "
        "init, or less than 0.1 below their unigram loss)"
    )
    assert said in out.reason


def test_a_run_at_its_unigram_loss_did_not_learn_though_far_below_its_loss_at_init(tmp_path, monkeypatch):
    """DyT's seed 0 completed at 3.30, well under 0.9 x its loss at init (4.0), but its step-0
    evaluation recorded a unigram loss of 3.36: 3.30 is not 0.1 below it, so it predicted each
    character's frequency and ignored its context. The same runs without a recorded unigram loss (runs
    trained before it was recorded) are read by the loss at init alone: nothing flagged."""
    for recorded in (True, False):
        runs = tmp_path / f"runs-{recorded}"
        for seed, (rms, dyt) in enumerate(zip([2.40, 2.41, 2.42], [3.30, 2.45, 2.50])):
            plant(runs, f"rms_s{seed}", seed=seed, final=rms, norm="rms")
            plant(runs, f"dyt_s{seed}", seed=seed, final=dyt, norm="dyt")
        for metrics in runs.glob("*/metrics.jsonl") if recorded else ():
            lines = [json.loads(line) for line in metrics.read_text().splitlines()]
            lines[0]["unigram_loss"] = 3.36
            metrics.write_text("".join(json.dumps(r) + "\n" for r in lines))
        only_charts(monkeypatch)
        out, _ = report([runs], out=tmp_path / f"report-{recorded}")
        agg = pd.read_csv(out / "aggregate.csv").set_index("norm")
        assert (agg.at["dyt", "did_not_learn"], agg.at["rms", "did_not_learn"]) == (
            (1, 0) if recorded else (0, 0)
        )


def test_what_each_arm_ran_with_is_said_in_the_report_and_the_claims_verdict(tmp_path, monkeypatch):
    """Post-LN ran under BERT's init without a tied head, Pre-LN under GPT-2's with one; the warm-up is
    the same. The report's verdict and the claim's line name the init and the head, not the warm-up,
    and the claim's line each arm's tuned value (0.01 for pre, 0.003 for post, by hand: their lowest
    means)."""
    runs = tmp_path / "runs"
    recipes = {"pre": {"model__init": "gpt2", "model__tie_head": True}, "post": {"model__init": "bert"}}
    recipes["post"]["model__tie_head"] = False
    losses = {"pre": {0.003: 2.3, 0.01: 2.0, 0.03: 2.2}, "post": {0.001: 2.6, 0.003: 2.4, 0.01: 2.5}}
    for placement, by_lr in losses.items():
        for lr, loss in by_lr.items():
            for seed in range(3):
                final = loss + 0.01 * seed
                name = f"{placement}_{lr:g}_s{seed}"
                plant(runs, name, seed=seed, final=final, placement=placement, lr=lr, **recipes[placement])
    only_charts(monkeypatch)
    out, _ = report([runs], out=tmp_path / "report")
    summary = " ".join((out / "summary.md").read_text().split())
    assert (
        "What each configuration ran with beyond its keys: post: train.lr=0.003, init bert, tied head false; "
        "pre: train.lr=0.01, init gpt2, tied head true."
    ) in summary
    path = write_claim(
        tmp_path / "conf",
        "mine",
        kind="better",
        a={"placement": "pre"},
        b={"placement": "post"},
        tune="train.lr",
    )
    verdict = assess(parse_claim(path), runs)
    assert (
        "arms: a (placement=pre) train.lr=0.01, init gpt2, tied head true; "
        "b (placement=post) train.lr=0.003, init bert, tied head false"
    ) in verdict_line(verdict)


def test_an_interval_from_two_seeds_comes_with_a_warning(tmp_path):
    runs = tmp_path / "runs"
    for seed, (la, lb) in enumerate(zip([2.10, 2.12], [2.00, 2.01])):
        plant(runs, f"rms_s{seed}", seed=seed, final=la, norm="rms")
        plant(runs, f"ln_s{seed}", seed=seed, final=lb, norm="ln")
    path = write_claim(
        tmp_path / "conf", "mine", kind="better", a={"norm": "rms"}, b={"norm": "ln"}, min_seeds=2
    )
    low, high = t_interval([0.10, 0.11])
    line = verdict_line(assess(parse_claim(path), runs))
    assert (
        f"a - b +0.105 [{low:+.3g}, {high:+.3g}] (95%, n = 2 and 2 seeds); warning: an interval from 2 seeds"
        in line
    )


def test_the_reports_intervals_name_their_level_and_seeds_and_warn_from_two(tmp_path, monkeypatch):
    """rms 0.1 worse than ln on each of two seeds (2.10, 2.12 against 2.00, 2.01): the difference's
    interval names 95% and n=2 and 2, with the two-seed warning; so does the best's."""
    runs = tmp_path / "runs"
    for seed, (la, lb) in enumerate(zip([2.10, 2.12], [2.00, 2.01])):
        plant(runs, f"rms_s{seed}", seed=seed, final=la, norm="rms")
        plant(runs, f"ln_s{seed}", seed=seed, final=lb, norm="ln")
    only_charts(monkeypatch)
    out, _ = report([runs], out=tmp_path / "report")
    summary = " ".join((out / "summary.md").read_text().split())
    low, high = t_interval([0.10, 0.11])
    assert f"rms by +0.105 [{low:+.3f}, {high:+.3f}] (95%, n=2 and 2, paired by seed, t, p=" in summary
    assert "; from 2 seeds: a fragile interval)" in summary
    assert "n=2; from 2 seeds: a fragile interval)." in summary  # the best's own interval

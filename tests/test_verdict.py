"""Verdicts: the tuning axis, LR sensitivity and seed statistics, on run directories with known numbers.

Every expected number is computed by hand here (a table, a formula), not by the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats
from test_report import make_run, only_charts, quiet, report

from normbench.core.errors import ConfigError
from normbench.report import run_report
from normbench.report.stats import compare, mean_ci
from normbench.report.tables import fmt_ci

T_975 = {2: 4.302652729911275, 4: 2.7764451051977987}  # Student's t, 97.5% quantile, by degrees of freedom

# ln/pre: final loss per (lr, seed); "d" = diverged. Loss at init 4.0 for every run.
#   lr      seed 0  seed 1  seed 2   mean over seeds, min(loss, init) per seed, diverged = init
#   1e-3    2.6     2.7     2.8      2.7
#   1e-2    2.1     2.2     2.3      2.2   <- best
#   1e-1    4.5     d       d        4.0   (4.5 is capped at the init loss 4.0)
# sensitivity = mean(2.7 - 2.2, 2.2 - 2.2, 4.0 - 2.2) = (0.5 + 0 + 1.8) / 3
LN = {1e-3: [2.6, 2.7, 2.8], 1e-2: [2.1, 2.2, 2.3], 1e-1: [4.5, "d", "d"]}
# rms/post over the same grid: best at 1e-3, diverges at 1e-1 on every seed
#   1e-3: 2.5 2.6 2.7 (2.6)   1e-2: 3.0 3.1 3.2 (3.1)   1e-1: d d d (4.0)
# sensitivity = (0 + 0.5 + 1.4) / 3
RMS = {1e-3: [2.5, 2.6, 2.7], 1e-2: [3.0, 3.1, 3.2], 1e-1: ["d", "d", "d"]}


def write_grid(root, norm, placement, table, init=4.0):
    for lr, losses in table.items():
        for seed, loss in enumerate(losses):
            diverged = loss == "d"
            make_run(
                root,
                f"{norm}-{placement}-{lr:g}-s{seed}",
                norm=norm,
                placement=placement,
                lr=lr,
                seed=seed,
                eps=1e-5,
                status="diverged" if diverged else "completed",
                final=math.nan if diverged else loss,
                init=init,
            )


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    root = tmp_path_factory.mktemp("grid")
    write_grid(root, "ln", "pre", LN)
    write_grid(root, "rms", "post", RMS)
    out, text = report([root])
    return out, text, pd.read_csv(out / "tuned.csv").set_index("config")


def test_best_value_sensitivity_and_ci_match_the_hand_computation(tuned):
    _out, _, t = tuned
    assert list(t.index) == ["ln/pre", "rms/post"]  # best first: 2.2 < 2.6
    ln, rms = t.loc["ln/pre"], t.loc["rms/post"]
    assert ln["tune_key"] == "train.lr"
    assert ln["best_value"] == pytest.approx(1e-2) and rms["best_value"] == pytest.approx(1e-3)
    assert ln["final_val_loss_mean"] == pytest.approx(2.2) and rms["final_val_loss_mean"] == pytest.approx(
        2.6
    )
    assert ln["lr_sensitivity"] == pytest.approx((0.5 + 0 + 1.8) / 3)
    assert rms["lr_sensitivity"] == pytest.approx((0 + 0.5 + 1.4) / 3)
    assert ln["loss_init"] == pytest.approx(4.0)
    assert ln["grid"] == rms["grid"] == "0.001 0.01 0.1"
    # values: 3 swept; 2 with every seed completed; 1 with diverged seeds; none failed
    assert (ln["values"], ln["values_completed"], ln["values_diverged"], ln["values_failed"]) == (3, 2, 1, 0)
    assert ln["diverged_at"] == "0.1 (2/3)" and rms["diverged_at"] == "0.1 (3/3)"
    # the mean's 95% interval at the best value: t with 2 degrees of freedom, sd 0.1 over 3 seeds
    half = T_975[2] * 0.1 / math.sqrt(3)
    assert (ln["ci_low"], ln["ci_high"]) == (pytest.approx(2.2 - half), pytest.approx(2.2 + half))
    assert ln["ci_method"] == "t" and ln["vs_best"] == "best"
    # rms/post at 1e-3 vs ln/pre at 1e-2, paired by seed: differences 0.4, 0.4, 0.4 exactly (no spread)
    assert rms["diff_vs_best"] == pytest.approx(0.4)
    assert rms["vs_best"] == "worse" and rms["diff_ci_low"] == pytest.approx(0.4)
    assert rms["test"].startswith("paired by seed")


def test_aggregate_gains_intervals_and_the_comparison_at_the_best_value(tuned):
    out, _, _ = tuned
    agg = pd.read_csv(out / "aggregate.csv")
    for col in (
        "ci_low",
        "ci_high",
        "ci_method",
        "diff_vs_best",
        "diff_ci_low",
        "diff_ci_high",
        "p_value",
        "vs_best",
    ):
        assert col in agg
    row = agg[(agg["norm"] == "ln") & (agg["train.lr"] == 1e-3)].iloc[0]
    half = T_975[2] * 0.1 / math.sqrt(3)
    assert row["ci_low"] == pytest.approx(2.7 - half) and pd.isna(row["vs_best"])  # not its best value
    assert agg.loc[(agg["norm"] == "rms") & (agg["train.lr"] == 1e-3), "vs_best"].item() == "worse"


def test_verdict_at_the_top_of_every_output(tuned):
    out, text, _ = tuned
    page = (out / "report.html").read_text()
    md = (out / "summary.md").read_text()
    for where in (page, md, " ".join(text.split())):
        assert "Best: ln/pre at train.lr=0.01, final validation loss 2.200" in where
        assert "Worse than the best" in where and "rms/post at train.lr=0.001 by +0.400" in where
        assert "ln/pre at train.lr 0.1 (2/3)" in where and "rms/post at train.lr 0.1 (3/3)" in where
        assert "ln/pre 0.767" in where and "rms/post 0.633" in where  # the sensitivities side by side
    assert page.index("Verdict") < page.index("Aggregate") and md.startswith("## Verdict")
    # rms/post's best value is the lowest of the grid: the verdict says the grid should be extended
    assert "edge of the grid" in md and "rms/post (0.001)" in md
    assert (out / "tuning.png").stat().st_size > 1000


def test_same_distribution_is_tied_and_a_planted_difference_is_worse(tmp_path):
    only = dict(formats=("png",))
    rng = np.random.default_rng(1)
    base = rng.normal(2.0, 0.01, 5)
    same = rng.normal(2.0, 0.01, 5)
    planted = base + 0.1 + rng.normal(0.0, 0.01, 5)
    for seed in range(5):
        make_run(tmp_path, f"ln{seed}", norm="ln", seed=seed, final=float(base[seed]))
        make_run(tmp_path, f"rms{seed}", norm="rms", seed=seed, final=float(same[seed]))
        make_run(tmp_path, f"gn{seed}", norm="gn", seed=seed, final=float(planted[seed]))
    out, _text = report([tmp_path], **only)
    agg = pd.read_csv(out / "aggregate.csv").set_index("config")
    best = agg.index[0]
    assert set(agg.loc[["ln", "rms"], "vs_best"]) == {"best", "tied"}
    other = "rms" if best == "ln" else "ln"
    assert agg.loc[other, "diff_ci_low"] <= 0 <= agg.loc[other, "diff_ci_high"]
    gn = agg.loc["gn"]
    assert gn["vs_best"] == "worse" and gn["diff_ci_low"] > 0
    assert gn["diff_ci_low"] < gn["diff_vs_best"] < gn["diff_ci_high"]
    assert gn["diff_vs_best"] == pytest.approx(0.1, abs=0.02)
    assert gn["test"] == "paired by seed, bootstrap BCa"  # 5 shared seeds
    # the p-value is the paired t-test's, computed here from the per-seed differences
    d = planted - (base if best == "ln" else same)
    t = d.mean() / (d.std(ddof=1) / math.sqrt(5))
    assert gn["p_value"] == pytest.approx(2 * scipy_stats.t.sf(abs(t), 4))
    md = (out / "summary.md").read_text()
    assert f"Tied with the best (the 95% CI of the difference includes 0): {other}" in md
    assert (
        f"Worse than the best (the 95% CI of the difference excludes 0): gn by {gn['diff_vs_best']:+.3f}"
        in md
    )
    assert "Every run used one learning rate (train.lr=0.003)" in md  # too thin: one LR


def test_one_seed_gives_no_interval(tmp_path):
    make_run(tmp_path, "a", norm="ln", final=2.0)
    make_run(tmp_path, "b", norm="rms", final=2.5)
    out, _text = report([tmp_path], formats=("png",))
    agg = pd.read_csv(out / "aggregate.csv").set_index("config")
    assert agg["ci_method"].tolist() == ["needs ≥ 2 seeds"] * 2 and agg["ci_low"].isna().all()
    assert agg.loc["rms", "vs_best"] == "needs ≥ 2 seeds" and pd.isna(agg.loc["rms", "diff_ci_low"])
    md = (out / "summary.md").read_text()
    assert "Evidence too thin: one completed seed" in md
    assert "Worse" not in md and "Tied" not in md  # nothing claimed without an interval
    assert "needs ≥ 2 seeds" in md


def test_interval_methods_by_sample_size():
    # 2 to 4 values: t interval, checked against the formula
    x = [2.0, 2.1, 2.3, 2.2]
    ci = mean_ci(x)
    half = 3.182446305284263 * np.std(x, ddof=1) / 2  # t quantile, 3 degrees of freedom
    assert ci.method == "t" and (ci.low, ci.high) == (pytest.approx(2.15 - half), pytest.approx(2.15 + half))
    # 5 or more: bootstrap BCa, an interval around the mean and inside the data's range
    y = [2.0, 2.1, 2.3, 2.2, 2.05, 2.15]
    ci = mean_ci(y)
    assert ci.method == "bootstrap BCa" and min(y) < ci.low < np.mean(y) < ci.high < max(y)
    assert mean_ci(y) == ci  # a fixed generator: the same runs give the same report
    # identical values: no spread, the point itself; one value: none
    assert mean_ci([2.0] * 6) == mean_ci([2.0, 2.0]) and mean_ci([2.0] * 6).method == "no spread"
    assert mean_ci([2.0]) is None and mean_ci([2.0, math.nan]) is None
    # different seeds: Welch, whose interval and p-value are scipy's ttest_ind(equal_var=False)
    a, b = {0: 2.0, 1: 2.2, 2: 2.1}, {3: 2.5, 4: 2.4, 5: 2.9}
    c = compare(a, b)
    ref = scipy_stats.ttest_ind(list(a.values()), list(b.values()), equal_var=False)
    assert not c.paired and c.method == "Welch, t" and c.p == pytest.approx(ref.pvalue)
    assert (c.ci.low, c.ci.high) == (
        pytest.approx(ref.confidence_interval().low),
        pytest.approx(ref.confidence_interval().high),
    )
    assert compare({0: 1.0}, {0: 2.0}).ci is None


def test_runs_without_a_step_0_eval_leave_the_sensitivity_empty(tmp_path, monkeypatch):
    only_charts(monkeypatch, "tuning")
    for lr in (1e-3, 1e-2):
        for seed in (0, 1):
            make_run(
                tmp_path, f"r{lr:g}{seed}", lr=lr, seed=seed, final=2.0 + lr * 10 + seed * 0.01, init=None
            )
    out, text = report([tmp_path])
    t = pd.read_csv(out / "tuned.csv")
    assert t["lr_sensitivity"].isna().all() and t["best_value"].item() == pytest.approx(1e-3)
    assert "LR sensitivity left empty" in " ".join(text.split()) and "no step-0 evaluation" in text
    assert "sensitivity not computed" in (out / "summary.md").read_text()


def test_bad_tune_keys_are_one_line_errors(tmp_path):
    for lr in (1e-3, 1e-2):
        make_run(tmp_path, f"r{lr:g}", lr=lr, norm="ln")
    make_run(tmp_path, "rms", lr=1e-3, norm="rms")
    for key, message in [
        ("train.momentum", "not a config key"),
        ("model.n_layer", "does not vary"),
        ("norm", "not numeric"),
    ]:
        with pytest.raises(ConfigError, match=message) as e:
            run_report([tmp_path], tune_key=key, console=quiet())
        assert e.value.allowed == ["train.lr", "none"]  # the numeric keys that vary
    assert not (tmp_path / "report").exists()  # nothing written
    out, _ = report([tmp_path], tune_key="none")
    assert not (out / "tuned.csv").exists() and "Best: " in (out / "summary.md").read_text()


def test_threads_and_progress_never_split_a_configuration(tmp_path, monkeypatch):
    only_charts(monkeypatch)
    make_run(tmp_path, "a", seed=0, threads=0, final=2.0)
    make_run(tmp_path, "b", seed=1, threads=4, final=2.2)
    out, _ = report([tmp_path])
    agg = pd.read_csv(out / "aggregate.csv")
    assert len(agg) == 1 and agg["final_val_loss_count"].item() == 2


def test_failed_before_training_is_counted(tmp_path, monkeypatch):
    only_charts(monkeypatch, "final_loss")
    make_run(tmp_path, "ok0", seed=0, final=2.0)
    make_run(tmp_path, "ok1", seed=1, final=2.1)
    broken = make_run(tmp_path, "broken", seed=2)
    (broken / "metrics.jsonl").unlink()  # a config error: failed summary, no metrics
    (broken / "summary.json").write_text('{"status": "failed", "error": "config error: model.n_head"}')
    out, text = report([tmp_path])
    agg = pd.read_csv(out / "aggregate.csv")
    assert (agg["runs"].item(), agg["completed"].item(), agg["failed"].item()) == (3, 2, 1)
    assert "no metrics.jsonl" not in text
    assert (
        "Failed (see the error column of summary.csv): ln/pre (1/3 runs)" in (out / "summary.md").read_text()
    )


def test_cli_bad_tune_exits_2_with_one_line(tmp_path):
    from typer.testing import CliRunner

    from normbench.cli import app

    for lr in (1e-3, 1e-2):
        make_run(tmp_path, f"r{lr:g}", lr=lr)
    result = CliRunner().invoke(app, ["report", str(tmp_path), "--tune", "model.n_layer"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == ["error: --tune model.n_layer: does not vary among these runs; allowed: train.lr, none"]


def test_every_run_failed_is_still_a_report(tmp_path, monkeypatch):
    only_charts(monkeypatch, "final_loss")
    for seed in (0, 1):
        run = make_run(tmp_path, f"f{seed}", seed=seed)
        (run / "metrics.jsonl").unlink()
        (run / "summary.json").write_text('{"status": "failed", "error": "boom"}')
    out, text = report([tmp_path])
    # one line says so; no groups, no aggregate, no "one completed seed per configuration"
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("report written")]
    assert lines == [
        "no run completed among the 2 runs (2 failed): nothing to compare; "
        "see the error column of summary.csv"
    ]
    assert (
        not (out / "aggregate.csv").exists() and pd.read_csv(out / "summary.csv")["status"].eq("failed").all()
    )
    md = (out / "summary.md").read_text()
    assert "no run completed among the 2 runs" in md and "group" not in md and "per configuration" not in md


def test_an_interval_that_excludes_zero_never_prints_as_touching_it():
    """[+0.0003, +0.035] must not read [+0.000, +0.035]: the verdict says 'worse', the print must agree."""
    assert fmt_ci({"ci_low": 0.00031, "ci_high": 0.0351}, sign="+") == "[+0.0003, +0.035]"
    assert fmt_ci({"ci_low": -0.00042, "ci_high": 0.031}, sign="+") == "[-0.0004, +0.031]"
    assert fmt_ci({"ci_low": 2.4801, "ci_high": 2.5204}) == "[2.480, 2.520]"
    assert fmt_ci({"ci_low": 0.0, "ci_high": 0.01}, sign="+") == "[+0.000, +0.010]"

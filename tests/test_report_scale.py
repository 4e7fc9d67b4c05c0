"""The report's scale axis (--scale, --baseline): per-size results, the trend of each difference, the
best value's drift, on run directories whose numbers are planted by hand.

The references are independent of normbench.report.scale: numpy's polyfit for the weighted least
squares, the paired differences' standard error written out, scipy's t quantile.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import run_cli
from matplotlib.colors import to_rgb
from scipy import stats as scipy_stats
from test_report import make_run, only_charts, quiet, report

from normbench.core.errors import ConfigError
from normbench.report import charts as charts_module
from normbench.report import run_report
from normbench.report.stats import NEEDS_SEEDS

WIDTHS = (16, 32, 64, 128)
PARAMS = {w: 12 * 2 * w * w + 64 * w for w in WIDTHS}  # a GPT's count at 2 layers, vocab 64: ~4x per doubling
# per-seed noise shared by both configurations (same data order, same init) and each one's own
SHARED = (0.00, 0.03, -0.02)
OWN = {
    16: (0.004, -0.003, 0.001),
    32: (-0.002, 0.005, -0.004),
    64: (0.003, 0.000, -0.004),
    128: (-0.001, 0.004, -0.002),
}


def scale_run(root, name, *, d_model, final=2.0, lr=0.003, seed=0, **kwargs):
    """make_run at a width: the config's model.d_model and summary.json's params set to it."""
    run = make_run(root, name, lr=lr, seed=seed, final=final, **kwargs)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"]["d_model"] = d_model
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    summary = json.loads((run / "summary.json").read_text())
    summary["params"] = PARAMS[d_model]
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def plant(root, gap, widths=WIDTHS, seeds=(0, 1, 2)):
    """ln: the baseline; rms = ln + gap(width) + its own per-seed noise."""
    for i, w in enumerate(widths):
        for seed in seeds:
            ln = 3.0 - 0.2 * i + SHARED[seed]
            scale_run(root, f"ln-{w}-s{seed}", norm="ln", d_model=w, seed=seed, final=ln)
            scale_run(
                root, f"rms-{w}-s{seed}", norm="rms", d_model=w, seed=seed, final=ln + gap(w) + OWN[w][seed]
            )


def hand_fit(gap):
    """The least-squares slope per doubling of params (numpy's polyfit), its variance from each size's
    SE, and the χ² of the sizes around the line in units of their SEs."""
    t = np.log2([PARAMS[w] for w in WIDTHS])
    diffs = np.array([[gap(w) + OWN[w][s] for s in range(3)] for w in WIDTHS])
    se = diffs.std(axis=1, ddof=1) / math.sqrt(3)
    slope, intercept = np.polyfit(t, diffs.mean(axis=1), 1)
    c = (t - t.mean()) / np.sum((t - t.mean()) ** 2)
    resid = diffs.mean(axis=1) - (intercept + slope * t)
    return slope, float(np.sum(c**2 * se**2)), float(np.sum((resid / se) ** 2))


def test_a_gap_growing_linearly_in_log_params_is_reported_as_growing(tmp_path, monkeypatch):
    only_charts(monkeypatch, "scale_gap")
    gap = lambda w: 0.01 * math.log2(PARAMS[w] / PARAMS[16])
    plant(tmp_path, gap)
    out, text = report([tmp_path], scale_key="model.d_model", baseline="norm=ln")
    trend = pd.read_csv(out / "trend.csv").set_index("config")
    rms = trend.loc["rms"]
    slope, var_seeds, chi2 = hand_fit(gap)
    assert rms["slope_per_doubling"] == pytest.approx(slope, rel=1e-9) and slope == pytest.approx(
        0.01, abs=2e-3
    )
    half = scipy_stats.t.ppf(0.975, rms["slope_df"]) * math.sqrt(var_seeds)  # the seeds' variance
    assert rms["lack_of_fit_p"] == pytest.approx(scipy_stats.chi2.sf(chi2, 2))  # 4 sizes: 2 df
    assert (rms["slope_ci_low"], rms["slope_ci_high"]) == pytest.approx(
        (slope - half, slope + half), rel=1e-9
    )
    assert rms["slope_ci_low"] > 0 and rms["trend"] == "grows" and rms["sizes_fitted"] == 4
    assert trend.loc["ln", "trend"] == "baseline"
    # each size's difference is the paired one: the mean of the per-seed differences, its t interval
    table = pd.read_csv(out / "scale.csv")
    at = table[table["config"].eq("rms") & table["model.d_model"].eq(64)].iloc[0]
    d = np.array([gap(64) + o for o in OWN[64]])
    se = d.std(ddof=1) / math.sqrt(3)
    assert at["diff_vs_baseline"] == pytest.approx(d.mean(), abs=1e-12) and at["diff_se"] == pytest.approx(se)
    assert at["diff_ci_high"] == pytest.approx(d.mean() + scipy_stats.t.ppf(0.975, 2) * se)
    assert at["params"] == PARAMS[64] and at["x"] == PARAMS[64] and at["tokens"] == 30 * 32 * 64
    sentence = next(s for s in text.replace("\n", " ").split("•") if s.strip().startswith("rms - ln"))
    assert "the gap grows with size" in " ".join(sentence.split())
    assert (out / "scale_gap.png").stat().st_size > 1000


def test_a_constant_gap_is_no_trend(tmp_path, monkeypatch):
    only_charts(monkeypatch)
    gap = lambda w: 0.05
    plant(tmp_path, gap)
    out, _ = report([tmp_path], scale_key="model.d_model", baseline="norm=ln,placement=pre")
    rms = pd.read_csv(out / "trend.csv").set_index("config").loc["rms"]
    assert rms["slope_per_doubling"] == pytest.approx(hand_fit(gap)[0], rel=1e-9)
    assert rms["slope_ci_low"] < 0 < rms["slope_ci_high"] and rms["trend"] == "no trend"
    md = " ".join((out / "summary.md").read_text().split())
    assert "## Trend across `model.d_model`" in md and "the gap shows no trend" in md
    assert "grows" not in md.split("## Trend")[1].split("|")[0].replace("grows / shrinks", "")


# Final loss per (width, lr) above each configuration's base, 0.1 per decade from its best lr;
# seed s adds 0.01 * s at every lr (so the best lr is the same for every seed).
GRID = (1e-3, 3e-3, 1e-2, 3e-2)
BEST = {"ln": {16: 1e-2, 32: 3e-3, 64: 1e-3}, "rms": {16: 1e-2, 32: 1e-2, 64: 1e-2}}


def test_best_lr_per_size_its_drift_and_sensitivity_match_a_hand_computation(tmp_path, monkeypatch):
    only_charts(monkeypatch, "scale_best_value", "scale_tuning")
    for norm, best in BEST.items():
        for i, (w, lr_best) in enumerate(best.items()):
            for lr in GRID:
                for seed in (0, 1):
                    scale_run(
                        tmp_path,
                        f"{norm}-{w}-{lr:g}-s{seed}",
                        norm=norm,
                        d_model=w,
                        lr=lr,
                        seed=seed,
                        final=3.0 - 0.2 * i + 0.1 * abs(math.log10(lr / lr_best)) + 0.01 * seed,
                    )
    out, text = report([tmp_path])  # train.lr tuned, model.d_model detected
    table = pd.read_csv(out / "scale.csv")
    for norm, best in BEST.items():
        for w, lr_best in best.items():
            row = table[table["config"].eq(norm) & table["model.d_model"].eq(w)].iloc[0]
            assert row["best_value"] == pytest.approx(lr_best)
            # Wortsman's sensitivity: mean over the grid of the excess over the best (no value near the init
            # loss)
            hand = sum(0.1 * abs(math.log10(lr / lr_best)) for lr in GRID) / len(GRID)
            assert row["lr_sensitivity"] == pytest.approx(hand, abs=1e-12)
    trend = pd.read_csv(out / "trend.csv").set_index("config")
    assert trend.at["ln", "best_drift_half_decades"] == pytest.approx(math.log10(1e-3 / 1e-2) / 0.5)  # -2
    assert trend.at["rms", "best_drift_half_decades"] == 0.0
    flat = " ".join(text.split())
    assert "Scale axis model.d_model (detected: the one size key that varies)" in flat
    assert "ln 0.01, 0.003, 0.001 (drift -2.0 half-decades)" in flat
    html = (out / "report.html").read_text()
    assert "Trend across model.d_model" in html
    for name in ("scale_best_value", "scale_tuning"):
        assert (out / f"{name}.png").stat().st_size > 1000


def test_a_size_with_one_seed_is_not_compared_and_claims_no_trend(tmp_path, monkeypatch):
    only_charts(monkeypatch)
    gap = lambda w: 0.1 * math.log2(w)
    plant(tmp_path, gap, widths=(16,))
    plant(tmp_path, gap, widths=(32,), seeds=(0,))
    out, _text = report([tmp_path], scale_key="model.d_model", baseline="norm=ln")
    table = pd.read_csv(out / "scale.csv")
    one = table[table["config"].eq("rms") & table["model.d_model"].eq(32)].iloc[0]
    assert one["diff_method"] == NEEDS_SEEDS and pd.isna(one["diff_ci_low"]) and one["vs_best"] == NEEDS_SEEDS
    rms = pd.read_csv(out / "trend.csv").set_index("config").loc["rms"]
    assert rms["trend"] == "needs ≥ 2 sizes with ≥ 2 seeds" and pd.isna(rms["slope_per_doubling"])
    assert rms["sizes_fitted"] == 1 and f"32 ({NEEDS_SEEDS})" in rms["sizes_not_compared"]
    section = " ".join((out / "summary.md").read_text().split("## Trend")[1].split("|")[0].split())
    assert "no trend claimed, needs ≥ 2 sizes with ≥ 2 seeds" in section
    # each size's own verdict is the report's verdict, above the trend section
    verdict = " ".join((out / "summary.md").read_text().split("## Trend")[0].split())
    assert "At d_model=32: best ln, " in verdict
    assert f"the best has n=1: {NEEDS_SEEDS}" in verdict
    for word in ("the gap grows", "the gap shrinks", "changes sign", "shows no trend"):
        assert word not in section


def test_bad_scale_and_baseline_are_one_line_errors_listing_what_varies(tmp_path):
    for w in (16, 32):
        for lr in (1e-3, 1e-2):
            for norm in ("ln", "rms"):
                # norm.eps follows the norm's name: it varies, but is no axis to offer
                scale_run(
                    tmp_path,
                    f"{norm}-{w}-{lr:g}",
                    norm=norm,
                    d_model=w,
                    lr=lr,
                    eps=1e-6 if norm == "rms" else 1e-5,
                )
    for key, message in [
        ("model.n_head", "does not vary"),
        ("norm", "not numeric"),
        ("train.lr", "is the tuning key"),
    ]:
        with pytest.raises(ConfigError, match=message) as e:
            run_report([tmp_path], scale_key=key, console=quiet())
        assert e.value.allowed == ["model.d_model", "none"]  # the numeric keys that vary besides --tune
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="matches no configuration") as e:
        run_report([tmp_path], scale_key="model.d_model", baseline="norm=bn", console=quiet())
    assert e.value.allowed == ["norm=ln", "norm=rms"]  # what --baseline takes
    with pytest.raises(ConfigError, match="--baseline compares across a scale axis"):
        run_report([tmp_path], scale_key="none", baseline="norm=ln", console=quiet())
    assert not (tmp_path / "report").exists()  # nothing written
    result = run_cli("report", str(tmp_path), "--scale", "model.n_head")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "does not vary among these runs; allowed: model.d_model, none" in " ".join(result.stderr.split())


def test_scale_none_writes_no_scale_files(tmp_path, monkeypatch):
    only_charts(monkeypatch)
    plant(tmp_path, lambda w: 0.0, widths=(16, 32))
    out, _ = report([tmp_path])
    assert (out / "scale.csv").exists() and (out / "trend.csv").exists()
    out, _ = report([tmp_path], scale_key="none")
    assert not (out / "scale.csv").exists() and not (out / "trend.csv").exists()
    assert "Trend across" not in (out / "report.html").read_text()


def test_trend_words_flip_only_when_the_measured_gap_is_significant_on_both_sides():
    from normbench.report.stats import Fit, trend_word

    # μP against SP: no gap at the base width (the same model), then a growing one; the fitted line
    # crosses 0 just above the smallest size, which is not a change of sign.
    rising = Fit(slope=0.016, low=0.014, high=0.018, df=4, method="seeds", first=-0.0002, last=0.063)
    assert (
        trend_word(rising, [0.0, 0.03, 0.06], ci_low=[0.0, 0.02, 0.05], ci_high=[0.0, 0.04, 0.07]) == "grows"
    )
    # DyT-like: better at the smallest budget, worse at the largest, both beyond their intervals.
    flipping = Fit(slope=0.02, low=0.01, high=0.03, df=4, method="seeds", first=-0.03, last=0.03)
    assert (
        trend_word(flipping, [-0.03, 0.0, 0.03], ci_low=[-0.05, -0.01, 0.01], ci_high=[-0.01, 0.01, 0.05])
        == "flips sign"
    )
    # A gap closing toward 0 from below, and one whose slope interval includes 0.
    closing = Fit(slope=0.01, low=0.005, high=0.015, df=4, method="seeds", first=-0.05, last=-0.01)
    assert (
        trend_word(closing, [-0.05, -0.03, -0.01], ci_low=[-0.06, -0.04, -0.02], ci_high=[-0.04, -0.02, 0.0])
        == "shrinks"
    )
    # DyT against LayerNorm over token budgets: +0.70, +0.32, +0.09, +0.02, +0.004, closing fast and
    # levelling off; the straight line through them ends below 0, the gaps never do.
    levelling = Fit(slope=-0.06, low=-0.071, high=-0.050, df=8, method="seeds", first=0.45, last=-0.03)
    assert (
        trend_word(
            levelling,
            [0.70, 0.32, 0.09, 0.02, 0.004],
            ci_low=[0.47, 0.18, 0.06, -0.01, -0.02],
            ci_high=[0.92, 0.47, 0.13, 0.05, 0.03],
        )
        == "shrinks"
    )
    flat = Fit(slope=0.01, low=-0.005, high=0.025, df=4, method="seeds", first=0.01, last=0.03)
    assert trend_word(flat, [0.02], ci_low=[0.0], ci_high=[0.05]) == "no trend"


def test_with_a_size_axis_the_verdict_compares_configurations_within_each_size(tmp_path, monkeypatch):
    """Never a small model ranked against a large one: one sentence per size, best of that size."""
    only_charts(monkeypatch)
    plant(tmp_path, lambda w: 0.05)  # ln better by 0.05 at every width; the widths 0.2 apart
    out, _ = report([tmp_path], scale_key="model.d_model", baseline="norm=ln")
    verdict = " ".join((out / "summary.md").read_text().split("## Trend")[0].split())
    for w in WIDTHS:
        assert f"At d_model={w}: best ln, " in verdict
    assert "Best: " not in verdict  # the ranking of (configuration, size) pairs is gone
    assert "rms +0.05" in verdict and "d_model=128 at" not in verdict


def test_with_a_size_axis_each_size_is_a_shade_of_its_configurations_colour(tmp_path, monkeypatch):
    """Every chart draws with the report's styles: captured here by a chart of the test's own."""
    styles = {}
    capture = ("capture", "styles", lambda d: styles.update(d.styles))  # returns None: nothing drawn
    monkeypatch.setattr(charts_module, "CHARTS", (capture,))
    plant(tmp_path, lambda w: 0.05)
    report([tmp_path], scale_key="model.d_model", baseline="norm=ln")
    for norm, colour in (("ln", "C0"), ("rms", "C1")):
        shades = [np.array(to_rgb(styles[f"{norm} d_model={w}"]["color"])) for w in WIDTHS]
        # lighter (mixed with white) for the smaller sizes, the configuration's own colour at the largest
        assert np.allclose(shades[-1], to_rgb(colour))
        assert all((a >= b - 1e-12).all() and (a > b).any() for a, b in itertools.pairwise(shades))
        markers = [styles[f"{norm} d_model={w}"]["marker"] for w in WIDTHS]
        assert len(set(markers)) == len(WIDTHS)


def test_the_slope_is_least_squares_and_its_interval_covers_a_planted_slope_at_its_stated_rate():
    from normbench.report.stats import compare, fit_trend

    # by hand: sizes 2, 4, 8 (log2 1, 2, 3), gaps 0.1, 0.3, 0.4, SEs 0.1, 0.2, 0.1, 2 df each
    fit = fit_trend([2, 4, 8], [0.1, 0.3, 0.4], [0.1, 0.2, 0.1], [2, 2, 2])
    var = (0.5**2) * 0.1**2 + (0.5**2) * 0.1**2  # c = (t - 2) / 2: -0.5, 0, 0.5
    assert fit.slope == pytest.approx(0.15)
    assert fit.df == pytest.approx(var**2 / (2 * (0.25 * 0.01) ** 2 / 2))
    assert fit.high - fit.slope == pytest.approx(scipy_stats.t.ppf(0.975, fit.df) * math.sqrt(var))
    # 300 planted draws of 5 sizes x 3 seeds: the 95% interval holds the true slope 90-99% of the time
    sizes, hits, draws = [32, 64, 128, 256, 512], 0, 300
    for draw in range(draws):
        rng = np.random.default_rng(draw)
        fits = []
        for size in sizes:
            common = rng.normal(0, 0.02, 3)
            truth = 0.01 * math.log2(size)
            a = {k: truth + common[k] + rng.normal(0, 0.005) for k in range(3)}
            b = {k: common[k] + rng.normal(0, 0.005) for k in range(3)}
            fits.append(compare(a, b))
        fit = fit_trend(sizes, [c.diff for c in fits], [c.se for c in fits], [c.df for c in fits])
        hits += fit.low <= 0.01 <= fit.high
    assert 0.90 <= hits / draws <= 0.99, hits / draws


def test_a_seed_diverged_at_its_best_value_is_read_at_each_size_as_the_tuned_table_reads_it(
    tmp_path, monkeypatch
):
    """rms at width 32: seed 0 diverged at 0.003 (its loss at init 3.0), still its best rate by the
    mean of every seed ((3.0 + 2.91 + 2.92) / 3 = 2.943 against 3.053 at 0.001). At that size the scale
    axis reads three seeds, the diverged one tied with the worst completed (2.92), as tuned.csv does."""
    only_charts(monkeypatch)
    for i, w in enumerate((16, 32)):
        for lr in (0.001, 0.003, 0.01):
            for seed in (0, 1, 2):
                for norm, offset in (("ln", 0.0), ("rms", 0.1)):
                    final = 3.0 - 0.2 * i + 0.3 * abs(math.log10(lr / 0.003)) + offset + 0.01 * seed
                    diverged = norm == "rms" and w == 32 and lr == 0.003 and seed == 0
                    status, init = ("diverged", 3.0) if diverged else ("completed", 4.0)
                    scale_run(
                        tmp_path,
                        f"{norm}-{w}-{lr:g}-s{seed}",
                        norm=norm,
                        d_model=w,
                        lr=lr,
                        seed=seed,
                        final=final,
                        status=status,
                        init=init,
                    )
    out, _ = report([tmp_path])
    row = pd.read_csv(out / "scale.csv").set_index(["config", "model.d_model"]).loc[("rms", 32)]
    assert row["best_value"] == pytest.approx(0.003)
    assert row["n_seeds"] == 3 and row["final_val_loss_mean"] == pytest.approx((2.92 + 2.91 + 2.92) / 3)

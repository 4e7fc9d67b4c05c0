"""The report's metric (--metric), its unit, the runs' provenance and the report's hygiene, on run
directories whose numbers are planted by hand.

Every expected number is computed here from the planted table (a mean, a t interval written out
with the t quantile), never by the code under test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from test_report import make_run, only_charts, quiet, report
from test_report_scale import scale_run

from normbench.claims.arms import at_best as claims_at_best
from normbench.core.errors import ConfigError
from normbench.report import load_runs, run_report
from normbench.report.load import find_inputs
from normbench.report.tuning import at_best_value

T_975_2DF = 4.302652729911275  # Student's t, 97.5% quantile, 2 degrees of freedom
SEEDS = (0, 1, 2)

# (final_val_loss, best_val_loss) per seed, per configuration and learning rate:
#   the final loss is lower at 1e-2 for both configurations, the best loss at 1e-3.
GRID = {
    ("ln", 1e-3): ([2.5, 2.6, 2.7], [2.0, 2.1, 2.2]),
    ("ln", 1e-2): ([2.3, 2.4, 2.5], [2.25, 2.35, 2.45]),
    ("rms", 1e-3): ([2.8, 2.9, 3.0], [2.3, 2.45, 2.5]),
    ("rms", 1e-2): ([2.6, 2.7, 2.8], [2.6, 2.7, 2.8]),
}


def hand_t(values) -> tuple[float, float]:
    """The 95% t interval of the mean of 3 values, written out."""
    x = np.asarray(values, float)
    half = T_975_2DF * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean() - half, x.mean() + half


def set_summary(run: Path, **fields) -> None:
    summary = json.loads((run / "summary.json").read_text())
    summary.update(fields)
    (run / "summary.json").write_text(json.dumps(summary))


def plant_grid(root, grid=GRID, **summary):
    for (norm, lr), (finals, bests) in grid.items():
        for seed, final, best in zip(SEEDS, finals, bests):
            run = make_run(
                root, f"{norm}-{lr:g}-s{seed}", norm=norm, lr=lr, seed=seed, final=final, best=best
            )
            if summary:
                set_summary(run, **summary)


@pytest.fixture(scope="module")
def grid_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("metric")
    plant_grid(root)
    return root


def test_the_metric_picks_each_configurations_best_lr_and_its_intervals(grid_root, monkeypatch):
    only_charts(monkeypatch)
    by_final = pd.read_csv(report([grid_root], out=grid_root / "final")[0] / "tuned.csv").set_index("config")
    out, _ = report([grid_root], metric="best_val_loss", out=grid_root / "best")
    by_best = pd.read_csv(out / "tuned.csv").set_index("config")
    assert by_final["best_value"].to_dict() == {"ln": pytest.approx(1e-2), "rms": pytest.approx(1e-2)}
    assert by_best["best_value"].to_dict() == {"ln": pytest.approx(1e-3), "rms": pytest.approx(1e-3)}
    ln, rms = by_best.loc["ln"], by_best.loc["rms"]
    assert ln["best_val_loss_mean"] == pytest.approx(2.1) and rms["best_val_loss_mean"] == pytest.approx(
        7.25 / 3
    )
    # the mean's interval and the paired one of the differences, both of the best validation loss
    assert (ln["ci_low"], ln["ci_high"]) == tuple(map(pytest.approx, hand_t([2.0, 2.1, 2.2])))
    diffs = np.subtract([2.3, 2.45, 2.5], [2.0, 2.1, 2.2])  # rms - ln at each one's best lr, per seed
    assert rms["diff_vs_best"] == pytest.approx(diffs.mean())
    assert (rms["diff_ci_low"], rms["diff_ci_high"]) == tuple(map(pytest.approx, hand_t(diffs)))
    assert rms["vs_best"] == "worse" and rms["test"] == "paired by seed, t"
    # the sensitivity of the best loss: init 4.0 caps nothing; mean excess over the grid
    assert ln["lr_sensitivity"] == pytest.approx((0 + 0.25) / 2)
    assert rms["lr_sensitivity"] == pytest.approx((0 + (2.7 - 7.25 / 3)) / 2)
    md = (out / "summary.md").read_text()
    assert "Best: ln at train.lr=0.001, best validation loss 2.100 nats/token" in md
    assert f"rms at train.lr=0.001 by {diffs.mean():+.3f}" in md
    assert "mean excess of the best validation loss" in md
    agg = pd.read_csv(out / "aggregate.csv")
    at_best = agg[agg["vs_best"].notna()].set_index("config")
    assert set(at_best.index) == {"ln lr=0.001", "rms lr=0.001"}


def test_at_best_value_gives_each_configurations_seeds_at_its_own_best_lr(grid_root):
    d = load_runs(find_inputs([grid_root])[0], warn=print)

    def seeds_at_best(norm, metric):
        runs = d.runs[d.runs["norm"].eq(norm)]
        chosen, _ = at_best_value(runs, "train.lr", runs[metric].where(runs["status"].eq("completed")))
        return dict(zip(runs.loc[chosen, "seed"], runs.loc[chosen, metric]))

    assert seeds_at_best("ln", "best_val_loss") == {0: 2.0, 1: 2.1, 2: 2.2}
    assert seeds_at_best("rms", "best_val_loss") == {0: 2.3, 1: 2.45, 2: 2.5}
    assert seeds_at_best("rms", "final_val_loss") == {0: 2.6, 1: 2.7, 2: 2.8}


def test_a_metric_where_higher_is_better_has_its_best_at_the_maximum(tmp_path, monkeypatch):
    only_charts(monkeypatch)
    speed = {
        ("ln", 1e-3): [1000, 1100, 1200],
        ("ln", 1e-2): [1500, 1600, 1700],
        ("rms", 1e-3): [900, 1000, 1100],
        ("rms", 1e-2): [1300, 1450, 1500],
    }
    for (norm, lr), values in speed.items():
        for seed, v in zip(SEEDS, values):
            make_run(tmp_path, f"{norm}-{lr:g}-s{seed}", norm=norm, lr=lr, seed=seed, tokens_per_s=float(v))
    out, text = report([tmp_path], metric="tokens_per_s")
    t = pd.read_csv(out / "tuned.csv").set_index("config")
    assert list(t.index) == ["ln", "rms"]  # best (fastest) first
    assert t["best_value"].tolist() == [pytest.approx(1e-2)] * 2
    diffs = np.subtract([1300, 1450, 1500], [1500, 1600, 1700])  # rms - ln, per seed: all negative
    rms = t.loc["rms"]
    assert rms["diff_vs_best"] == pytest.approx(diffs.mean())
    assert (rms["diff_ci_low"], rms["diff_ci_high"]) == tuple(map(pytest.approx, hand_t(diffs)))
    assert rms["vs_best"] == "worse"  # slower: its interval lies below 0
    assert pd.isna(t["lr_sensitivity"]).all()
    md = (out / "summary.md").read_text()
    assert "Best: ln at train.lr=0.01, throughput 1,600 tokens/s" in md
    assert "Worse than the best" in md and f"rms at train.lr=0.01 by {diffs.mean():+,.0f}" in md
    assert "sensitivity not computed: it measures a loss" in md
    assert "by throughput (tokens/s, descending" in " ".join(text.split())


def test_bits_per_byte_heads_every_table_and_sentence_and_tunes_on_bits(tmp_path, monkeypatch):
    """Two tokenizers' bytes per token: the lower loss in nats is the higher one in bits per byte."""
    only_charts(monkeypatch)
    # ln/pre: lr 1e-3 loss 2.0 nats at 4 bytes/token (0.721 bits/byte); lr 1e-2 1.9 at 3 (0.914)
    for lr, final, bpt in ((1e-3, 2.0, 4.0), (1e-2, 1.9, 3.0)):
        for seed in SEEDS:
            loss = final + 0.01 * seed
            run = make_run(tmp_path, f"ln-{lr:g}-s{seed}", lr=lr, seed=seed, final=loss)
            set_summary(run, bytes_per_token=bpt, final_val_bpb=loss / math.log(2) / bpt)
    nats = pd.read_csv(report([tmp_path], out=tmp_path / "nats")[0] / "tuned.csv")
    out, text = report([tmp_path], metric="final_val_bpb")
    bits = pd.read_csv(out / "tuned.csv")
    assert nats["best_value"].item() == pytest.approx(1e-2) and bits["best_value"].item() == pytest.approx(
        1e-3
    )
    mean = np.mean([(2.0 + 0.01 * s) / math.log(2) / 4.0 for s in SEEDS])
    assert bits["final_val_loss_mean"].item() == pytest.approx(mean)
    md, page, flat = (
        (out / "summary.md").read_text(),
        (out / "report.html").read_text(),
        " ".join(text.split()),
    )
    for where in (md, page, flat):
        assert f"final validation loss {mean:.3f} bits/byte" in where
        assert "final val loss (bits/byte)" in where  # the aggregate's and the tuned table's column
        assert "final val loss (nats/token)" not in where
    assert "final val loss (nats/token)" in (tmp_path / "nats" / "summary.md").read_text()


def provenance(numerics=1, torch="2.13.0+cpu", impl="fused-cpu", commit="29939de", dirty=False) -> dict:
    return {
        "normbench": "0.1.0",
        "commit": commit,
        "dirty": dirty,
        "torch": torch,
        "device": "cpu",
        "device_name": "AMD EPYC",
        "threads": 2,
        "precision": "fp32",
        "norm_impl": {"rms": impl},
        "compile": "off",
        "numerics": numerics,
    }


def plant_provenance(root, blocks: dict) -> None:
    """Two seeds per norm; blocks: norm -> provenance block per seed (None: a run from before provenance)."""
    for norm, per_seed in blocks.items():
        for seed, block in enumerate(per_seed):
            run = make_run(root, f"{norm}-s{seed}", norm=norm, seed=seed, final=2.0 + 0.1 * seed)
            if block is not None:
                set_summary(run, provenance=block)


def test_runs_of_different_numerics_are_refused_unless_allowed(tmp_path, monkeypatch):
    only_charts(monkeypatch)
    # ln's runs predate provenance: the legacy numerics version 0; rms ran with version 2
    plant_provenance(tmp_path, {"ln": [None, None], "rms": [provenance(2), provenance(2)]})
    with pytest.raises(ConfigError, match=r"different numerics versions \(0, 2\).*--allow-mixed"):
        run_report([tmp_path], console=quiet())
    assert not (tmp_path / "report").exists()  # nothing written
    from typer.testing import CliRunner

    from normbench.cli import app

    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "(0, 2)" in lines[0] and "--allow-mixed" in lines[0]
    out, _ = report([tmp_path], allow_mixed=True)
    md = (out / "summary.md").read_text()
    assert (
        "Mixed numerics versions (the runs are not the same computation), which configurations ran each: "
        "0 (ln); 2 (rms)." in md
    )
    assert "numerics 0, 2; norm implementations rms=fused-cpu (2 of 4 runs recorded none)." in md


def test_a_metric_no_completed_run_reports_is_a_one_line_error(grid_root):
    with pytest.raises(ConfigError, match="--metric mfu: no completed run reports it") as e:
        run_report([grid_root], out=grid_root / "mfu", metric="mfu", console=quiet())
    assert "tokens_per_s" in e.value.allowed and "mfu" not in e.value.allowed
    assert "final_val_bpb" not in e.value.allowed  # no run knows its bytes per token
    assert not (grid_root / "mfu").exists()


def test_mixed_torch_and_norm_implementations_are_named_and_provenance_is_summarised(tmp_path, monkeypatch):
    only_charts(monkeypatch)
    plant_provenance(
        tmp_path,
        {
            "ln": [provenance(), provenance()],
            "rms": [provenance(torch="2.12.0", impl="torch"), provenance(commit="b4b0fbc", dirty=True)],
        },
    )
    out, text = report([tmp_path])
    md, page, flat = (
        (out / "summary.md").read_text(),
        (out / "report.html").read_text(),
        " ".join(text.split()),
    )
    for where in (md, page, flat):
        assert (
            "Mixed torch versions, which configurations ran each: 2.12.0 (rms); 2.13.0+cpu (ln, rms)."
            in where
        )
        assert (
            "Mixed norm implementations, which configurations ran each: rms=fused-cpu (ln, rms); "
            "rms=torch (rms)." in where
        )
        assert "Mixed numerics" not in where
        assert (
            "Provenance: commit 29939de, b4b0fbc (uncommitted changes); torch 2.13.0+cpu, 2.12.0; "
            "device cpu (AMD EPYC); precision fp32; compile off; numerics 1; "
            "norm implementations rms=fused-cpu, rms=torch." in where
        )
    runs = pd.read_csv(out / "summary.csv")
    assert set(runs["provenance.numerics"]) == {1}


def test_two_norms_each_by_its_own_one_path_are_not_called_mixed(tmp_path, monkeypatch):
    only_charts(monkeypatch)
    ln, rms = provenance(), provenance()
    ln["norm_impl"] = {"ln": "eager"}  # rms by its kernel, ln eagerly: what norm.impl=auto gives
    plant_provenance(tmp_path, {"ln": [ln, ln], "rms": [rms, rms]})
    out, text = report([tmp_path])
    assert "Mixed norm implementations" not in " ".join(text.split())
    assert "norm implementations ln=eager, rms=fused-cpu." in (out / "summary.md").read_text()


def test_failed_runs_never_create_a_group(tmp_path, monkeypatch):
    only_charts(monkeypatch)
    make_run(tmp_path, "ok0", seed=0, final=2.0)
    make_run(tmp_path, "ok1", seed=1, final=2.2)
    broken = make_run(tmp_path, "broken", seed=2)  # a config that does not validate: n_head=3
    config = yaml.safe_load((broken / "config.yaml").read_text())
    config["model"]["n_head"] = 3
    (broken / "config.yaml").write_text(yaml.safe_dump(config))
    (broken / "metrics.jsonl").unlink()
    (broken / "summary.json").write_text('{"status": "failed", "error": "n_head=3 does not divide d_model"}')
    out, _ = report([tmp_path])
    agg = pd.read_csv(out / "aggregate.csv")
    assert len(agg) == 1 and (agg["runs"].item(), agg["completed"].item(), agg["failed"].item()) == (3, 2, 1)


def test_with_a_size_axis_the_aggregate_ranks_within_each_size(tmp_path, monkeypatch):
    """rms at 32 is worse than ln at 32 and better than ln at 64: compared within its size only."""
    only_charts(monkeypatch)
    finals = {("ln", 32): [2.50, 2.60, 2.70], ("rms", 32): [2.60, 2.72, 2.80], ("ln", 64): [2.30, 2.40, 2.50]}
    finals[("rms", 64)] = [2.31, 2.42, 2.50]
    for (norm, width), values in finals.items():
        for seed, v in zip(SEEDS, values):
            scale_run(tmp_path, f"{norm}-{width}-s{seed}", norm=norm, d_model=width, seed=seed, final=v)
    out, text = report([tmp_path], scale_key="model.d_model")
    agg = pd.read_csv(out / "aggregate.csv").set_index("config")
    assert list(agg.index) == [
        "ln d_model=32",
        "rms d_model=32",
        "ln d_model=64",
        "rms d_model=64",
    ]
    assert agg.loc["ln d_model=32", "vs_best"] == agg.loc["ln d_model=64", "vs_best"] == "best"
    diffs = np.subtract(finals[("rms", 32)], finals[("ln", 32)])
    rms32 = agg.loc["rms d_model=32"]
    assert rms32["diff_vs_best"] == pytest.approx(diffs.mean())  # against ln at 32, not at 64
    assert (rms32["diff_ci_low"], rms32["diff_ci_high"]) == tuple(map(pytest.approx, hand_t(diffs)))
    assert "within each model.d_model" in " ".join(text.split())


def test_the_page_links_the_method_page_in_the_repository(tmp_path, monkeypatch):
    only_charts(monkeypatch)
    make_run(tmp_path / "results", "a", norm="ln")
    make_run(tmp_path / "results", "b", norm="rms")
    out, _ = report([tmp_path / "results"])
    page = (out / "report.html").read_text()
    assert "see the README" not in page
    href = page.split("<a href='", 1)[1].split("'", 1)[0]
    docs = Path(__file__).resolve().parents[1] / "docs" / "reports.md"
    assert (out / href).resolve() == docs and docs.is_file()


def test_piped_tables_keep_every_number_whole(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from normbench.cli import app

    only_charts(monkeypatch)
    for norm in ("ln", "rms", "gn"):
        for seed in (0, 1):
            make_run(tmp_path, f"{norm}{seed}", norm=norm, seed=seed, final=2.123456 + 0.1 * seed)
    result = CliRunner().invoke(app, ["report", str(tmp_path)])  # CliRunner's stdout is not a TTY
    assert result.exit_code == 0
    assert "…" not in result.output
    assert "2.173 ± 0.071 (n=2)" in result.output  # the final loss column, whole
    narrow = CliRunner().invoke(app, ["report", str(tmp_path), "--width", "60"])
    # a width asked for is the width used
    assert narrow.exit_code == 0 and max(map(len, narrow.output.splitlines())) <= 60


def test_a_rate_whose_survivor_is_lowest_but_most_seeds_diverged_is_not_the_best(tmp_path, monkeypatch):
    """Two rates x three seeds; two seeds of the higher rate diverged, its survivor the lowest loss of
    all. Every seed counts (a diverged one at its loss at init, 4.0): the lower rate is best."""
    only_charts(monkeypatch)
    low, survivor = [2.50, 2.55, 2.60], 2.30
    for seed in SEEDS:
        make_run(tmp_path, f"low-s{seed}", lr=0.02, seed=seed, final=low[seed])
        status = "completed" if seed == 0 else "diverged"
        make_run(tmp_path, f"high-s{seed}", lr=0.03, seed=seed, final=survivor, status=status)
    out, _ = report([tmp_path])
    t = pd.read_csv(out / "tuned.csv").iloc[0]
    assert t["best_value"] == pytest.approx(0.02)
    assert t["final_val_loss_mean"] == pytest.approx(np.mean(low)) and t["n_seeds"] == 3
    # the higher rate's score, by hand: (2.30 + 4.0 + 4.0) / 3 = 3.43 > 2.55
    assert t["diverged_at"] == "0.03 (2/3)"
    d = load_runs(find_inputs([tmp_path])[0], warn=print)
    runs, _ = claims_at_best(d.runs, "train.lr")
    assert set(pd.to_numeric(runs["train.lr"])) == {0.02}  # the claims registry chooses the same rate


def test_a_best_value_on_fewer_seeds_than_the_others_is_said(tmp_path, monkeypatch):
    only_charts(monkeypatch)
    for seed in SEEDS:
        make_run(tmp_path, f"low-s{seed}", lr=0.01, seed=seed, final=2.6 + 0.01 * seed)
    make_run(tmp_path, "high-s0", lr=0.02, seed=0, final=2.3)  # one seed only, at the best rate
    out, _ = report([tmp_path])
    t = pd.read_csv(out / "tuned.csv").iloc[0]
    assert (t["best_value"], t["n_seeds"], t["n_seeds_most"]) == (pytest.approx(0.02), 1, 3)
    md = " ".join((out / "summary.md").read_text().split())
    assert "resting on fewer seeds than other values of the grid: all runs at 0.02 (n=1; up to 3" in md

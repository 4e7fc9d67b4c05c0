"""normbench.report's diagnostics on fabricated run directories: the logit charts, the per-layer
charts at each configuration's best rate, the bench's cost note, chart styles per placement."""

from __future__ import annotations

import io
import json
import math

import pandas as pd
import pytest
from conftest import run_cli
from rich.console import Console
from test_report import capture_charts, lines_by_label, make_run, only_charts, quiet, report

from normbench.core.errors import ConfigError
from normbench.report import charts as charts_module
from normbench.report import run_report
from normbench.report.charts import styles as chart_styles

# --- logit diagnostics and implementation cost ----------------------------------------------------------


def test_logit_chart_plots_the_seed_mean_and_skips_non_finite_values(tmp_path, monkeypatch):
    drawn = capture_charts(monkeypatch, "logits")
    make_run(tmp_path, "ln0", norm="ln", seed=0, logits=[(2.0, 4.0), (4.0, 4.5), (8.0, 5.0)])
    make_run(tmp_path, "ln1", norm="ln", seed=1, logits=[(4.0, 4.2), (6.0, 4.4), (10.0, 5.2)])
    make_run(
        tmp_path,
        "rms0",
        norm="rms",
        seed=0,
        status="diverged",
        final=math.nan,
        logits=[(1.0, 4.0), (2.0, 4.1), (math.inf, math.nan)],
    )
    out, _text = report([tmp_path])
    attn, log_z = drawn["logits"].axes[:2]
    assert attn.get_yscale() == "log" and log_z.get_yscale() == "linear"
    ln_attn, rms_attn = lines_by_label(attn)["ln"], lines_by_label(attn)["rms"]
    assert ln_attn[0] == [0, 10, 20] and ln_attn[1] == pytest.approx([3.0, 5.0, 9.0])  # mean of the two seeds
    assert lines_by_label(log_z)["ln"][1] == pytest.approx([4.1, 4.45, 5.1])
    assert rms_attn == ([0, 10], pytest.approx([1.0, 2.0]))  # the diverged run up to its last finite value
    # the peaks from summary.json: mean over runs per configuration, in aggregate.csv and the tables
    agg = pd.read_csv(out / "aggregate.csv").set_index("norm")
    assert agg.loc["ln", "max_attn_logit_mean"] == pytest.approx(9.0)
    assert agg.loc["rms", "max_log_z_mean"] == pytest.approx(4.1)
    md = (out / "summary.md").read_text()
    assert "| max attn logit | max log Z |" in md
    ln_row = next(line for line in md.splitlines() if line.startswith("| ln |"))
    assert "| 9 | 5.1 |" in ln_row  # peaks 8, 10 and 5.0, 5.2
    assert (out / "logits.png").stat().st_size > 1000


def test_logit_chart_draws_the_raw_attention_logit_when_a_run_was_soft_capped(tmp_path, monkeypatch):
    """Under model.attn_softcap the capped logit stays below the cap; the chart then adds the logit
    before it (max_attn_logit_raw), where the growth shows. Uncapped runs draw it as their capped one."""
    drawn = capture_charts(monkeypatch, "logits")
    capped = make_run(tmp_path, "capped", norm="ln", logits=[(2.0, 4.0), (10.0, 4.5), (20.0, 5.0)])
    make_run(tmp_path, "plain", norm="rms", logits=[(2.0, 4.0), (4.0, 4.5), (8.0, 5.0)])
    lines = [json.loads(line) for line in (capped / "metrics.jsonl").read_text().splitlines()]
    for record, raw in zip((r for r in lines if r["kind"] == "stats"), (2.0, 40.0, 400.0)):
        record.update(max_attn_logit_raw=raw, max_log_z_raw=record["max_log_z"])
    (capped / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    report([tmp_path])
    attn, raw, log_z = drawn["logits"].axes[:3]
    assert "before the soft-cap" in raw.get_title() and "log Z" in log_z.get_title()
    assert lines_by_label(raw)["ln"][1] == pytest.approx([2.0, 40.0, 400.0])
    assert lines_by_label(raw)["rms"][1] == pytest.approx(
        [2.0, 4.0, 8.0]
    )  # uncapped: raw is what softmax saw
    assert lines_by_label(attn)["ln"][1] == pytest.approx([2.0, 10.0, 20.0])


def test_per_layer_and_loss_charts_draw_each_configuration_at_its_best_learning_rate(tmp_path, monkeypatch):
    """Tuned over train.lr, the per-layer chart has one line per configuration (at its best rate),
    not one per rate of the grid."""
    drawn = capture_charts(monkeypatch, "grad_by_layer", "loss_curves", "grad_norm")
    for lr, final in ((0.001, 2.5), (0.01, 2.0), (0.1, 3.0)):
        for seed in (0, 1):
            make_run(tmp_path, f"ln_{lr}_{seed}", norm="ln", lr=lr, seed=seed, final=final + 0.01 * seed)
            make_run(
                tmp_path, f"rms_{lr}_{seed}", norm="rms", lr=lr, seed=seed, final=final + 0.3 - 0.01 * seed
            )
    report([tmp_path])
    labels = set(lines_by_label(drawn["grad_by_layer"].axes[0]))
    assert labels == {"ln lr=0.01", "rms lr=0.01"}, labels
    assert "at its best train.lr" in drawn["grad_by_layer"].get_suptitle()
    curves = set(lines_by_label(drawn["loss_curves"].axes[0])) - {"synthetic floor (Bayes-optimal loss)"}
    assert curves == {"ln lr=0.01", "rms lr=0.01"}, curves  # the loss curves too
    assert set(lines_by_label(drawn["grad_norm"].axes[0])) == {
        "ln lr=0.01",
        "rms lr=0.01",
    }  # and the gradient norm


def test_narrow_terminal_drops_the_logit_columns(tmp_path):
    for norm, seed in (("ln", 0), ("rms", 0)):
        make_run(tmp_path, f"{norm}{seed}", norm=norm, seed=seed, logits=[(2.0, 4.0), (4.0, 4.5), (8.0, 5.0)])
    wide, narrow = Console(file=io.StringIO(), width=250), Console(file=io.StringIO(), width=100)
    only = ("loss_curves",)
    for console in (wide, narrow):
        orig = charts_module.CHARTS
        charts_module.CHARTS = tuple(c for c in orig if c[0] in only)
        try:
            run_report([tmp_path], out=tmp_path / f"report{console.width}", console=console)
        finally:
            charts_module.CHARTS = orig
    assert "max attn logit" in wide.file.getvalue()
    assert "max attn logit" not in narrow.file.getvalue()
    assert "best val loss (nats/token)" in wide.file.getvalue()
    assert "best val loss" not in narrow.file.getvalue()


BENCH_HEADER = "norm,impl,dim,dtype,device,pass,tokens,ms,gb_per_s,copy_gb_per_s,ratio_to_ln\n"


def bench_csv(path, rows) -> None:
    """rows: (norm, impl, dim, pass, ratio_to_ln, gb_per_s); LayerNorm's native op takes 1 ms, copy runs at
    10 GB/s."""
    path.write_text(
        BENCH_HEADER
        + "".join(
            f"{n},{impl},{dim},fp32,cpu,{pass_},1024,{ratio},{gb},10.0,{ratio}\n"
            for n, impl, dim, pass_, ratio, gb in rows
        )
    )


SLOW_BENCH = [
    ("ln", "normbench", 256, "fwd", 1.0, 5.0),
    ("ln", "native", 256, "fwd", 1.0, 5.0),
    ("rms", "normbench", 256, "fwd", 1.05, 4.0),
    ("rms", "normbench", 1024, "fwd+bwd", 1.3, 3.0),
    ("rms", "native", 256, "fwd", 2.5, 2.0),  # PyTorch's op, not normbench's: not listed
    ("scale", "normbench", 256, "fwd", 1.0, 5.0),
    ("scale", "normbench", 1024, "fwd+bwd", 1.09, 5.0),
    ("dyt", "normbench", 256, "fwd", 1.2, 6.0),
    ("dyt", "normbench", 1024, "fwd+bwd", 1.15, 6.0),
    ("gn", "normbench", 128, "fwd", 1.4, 4.0),
    ("gn", "native", 128, "fwd", 6.0, 1.0),
    ("bn", "normbench", 256, "fwd", 3.0, 1.0),
]  # BatchNorm's math differs: not listed


def test_bench_note_lists_exactly_the_norms_over_the_limit(tmp_path, monkeypatch):
    from normbench.report.cost import implementation_note
    from normbench.report.load import read_bench

    bench_csv(tmp_path / "b.csv", SLOW_BENCH)
    note = implementation_note(read_bench([tmp_path / "b.csv"]))
    assert note == (
        "Implementations not at their limit on cpu: dyt (1.20x LayerNorm at 256 fp32 fwd); "
        "gn (1.40x LayerNorm at 128 fp32 fwd); rms (1.30x LayerNorm at 1024 fp32 fwd+bwd) — "
        "throughput differences there measure the implementation, not the norm."
    )
    assert implementation_note(read_bench([tmp_path / "b.csv"]), norms=["ln", "scale"]).startswith(
        "Implementations at their limit in the bench: scale within 1.1x"
    )

    drawn = capture_charts(monkeypatch, "bench", "throughput")
    make_run(tmp_path / "runs", "a", norm="ln", stats=False)
    make_run(tmp_path / "runs", "b", norm="rms", stats=False)
    out, _text = report([tmp_path / "runs", tmp_path / "b.csv"])
    fig = drawn["bench"]
    assert "dyt (1.20x" in fig.get_supxlabel().replace("\n", " ") and "scale" not in fig.get_supxlabel()
    ratio_ax = fig.axes[0]
    copy_ax = next(a for a in fig.axes if "bandwidth" in a.get_title() and "fwd+bwd" in a.get_title())
    assert ratio_ax.get_yscale() == "log"
    references = {
        (line.get_linestyle(), tuple(line.get_ydata()))
        for line in ratio_ax.get_lines()
        if not line.get_label().startswith(("ln", "rms", "scale", "dyt", "bn", "gn"))
    }
    assert references == {("--", (1.0, 1.0)), (":", (1.1, 1.1))}  # LayerNorm = 1 and the 1.1x goal
    assert lines_by_label(copy_ax)["rms (normbench)"] == ([1024], pytest.approx([30.0]))  # 3 / 10 GB/s
    assert "rms (native)" not in lines_by_label(copy_ax)
    # the throughput chart (norms compared) and the verdict carry the note for the runs' norms only
    assert "rms (1.30x LayerNorm" in drawn["throughput"].get_supxlabel().replace("\n", " ")
    assert "dyt" not in drawn["throughput"].get_supxlabel()
    sentence = next(s for s in (out / "summary.md").read_text().splitlines() if s.startswith("- Throughput"))
    assert "not at their limit on cpu: rms (1.30x LayerNorm at 1024 fp32 fwd+bwd)" in sentence


def test_bench_note_holds_derf_to_layernorms_op_as_the_bench_does(tmp_path):
    from normbench.report.cost import implementation_note
    from normbench.report.load import read_bench

    bench_csv(
        tmp_path / "b.csv",
        [("ln", "native", 256, "fwd", 1.0, 5.0), ("derf", "normbench", 256, "fwd", 1.3, 4.0)],
    )
    assert implementation_note(read_bench([tmp_path / "b.csv"])).startswith(
        "Implementations not at their limit on cpu: derf (1.30x LayerNorm at 256 fp32 fwd)"
    )


def test_without_a_bench_csv_the_throughput_note_says_the_cost_is_unknown(tmp_path, monkeypatch):
    drawn = capture_charts(monkeypatch, "throughput")
    make_run(tmp_path, "a", norm="ln", stats=False)
    make_run(tmp_path, "b", norm="rms", stats=False)
    out, _ = report([tmp_path])
    for text in (
        drawn["throughput"].get_supxlabel().replace("\n", " ").replace("\u00a0", " "),
        (out / "summary.md").read_text(),
    ):
        assert "implementation cost on this device is unknown" in text
        assert "`normbench bench --out bench.csv`" in text and "`normbench report RUNS bench.csv`" in text
    # one norm: nothing compared, no note
    make_run(tmp_path / "one", "a", norm="ln", stats=False)
    report([tmp_path / "one"])
    assert drawn["throughput"].get_supxlabel() == ""


def test_a_sweep_in_progress_with_nothing_finished_is_one_line_saying_what_runs(tmp_path):
    from normbench.core.runs import RunLock

    sweep_dir = tmp_path / "S"
    for name in ("running", "killed"):
        make_run(sweep_dir, name, summary=False)
    (sweep_dir / "plan.json").write_text(
        json.dumps({"jobs": [{"run_dir": d} for d in ("running", "killed", "later")]})
    )
    lock = RunLock(sweep_dir / "running")
    assert lock.acquire() is None  # a job trains it now
    try:
        with pytest.raises(ConfigError) as e:
            run_report([sweep_dir], console=quiet())
        assert str(e.value) == (
            f"nothing finished yet in {sweep_dir}: 1 running, 1 interrupted, 1 pending; "
            "run normbench report again once a run has finished"
        )
        result = run_cli("report", str(sweep_dir))
        assert result.returncode == 2 and "nothing finished yet" in result.stderr
        assert "Traceback" not in result.stderr and "warning" not in result.stderr
    finally:
        lock.release()


def test_every_placement_has_its_own_chart_style():
    from normbench.model.placements import PLACEMENTS

    styles = [chart_styles.placement_style(name) for name in PLACEMENTS]
    assert len({str(ls) for ls, _ in styles}) == len(PLACEMENTS) and len({h for _, h in styles}) == len(
        PLACEMENTS
    )
    assert chart_styles.placement_style("a-new-placement") == chart_styles.placement_style("a-new-placement")


def test_hybrid_placement_has_a_fixed_style_no_other_placement_uses():
    ours = chart_styles.placement_style("hybrid")
    assert ours == chart_styles.PLACEMENT_STYLES["hybrid"]
    others = [style for name, style in chart_styles.PLACEMENT_STYLES.items() if name != "hybrid"]
    for ls, hatch in [*others, *chart_styles.EXTRA_STYLES, chart_styles.MIXED_STYLE]:
        assert str(ls) != str(ours[0]) and hatch != ours[1]


def test_saturation_of_point_wise_norms_reaches_the_layers_table_and_its_chart(tmp_path, monkeypatch):
    """A dyt run's per-layer saturation (the largest of the layer's norms) is read; an ln run has none."""
    from normbench.report.load import load_runs

    dyt = make_run(tmp_path, "dyt", norm="dyt")
    make_run(tmp_path, "ln", norm="ln")
    lines = [json.loads(line) for line in (dyt / "metrics.jsonl").read_text().splitlines()]
    for record in lines:
        if record["kind"] == "stats":
            for i, layer in enumerate(record["layers"]):
                layer["saturation"] = {"norm_attn": 0.1 * i, "norm_mlp": 0.05}
    (dyt / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    layers = load_runs([dyt, tmp_path / "ln"], warn=print).layers
    assert layers[layers["run"].eq(0)]["saturation"].tolist() == [0.05, 0.1] * 2  # first and last record
    assert layers[layers["run"].eq(1)]["saturation"].isna().all()
    only_charts(monkeypatch, "grad_by_layer")
    out, _ = report([tmp_path])
    assert (out / "grad_by_layer.png").exists()


def timed_runs(root, speeds: dict, timed_steps=200, **summary_fields):
    """Three completed seeds per norm at the given tokens/s, each summary saying how many steps were timed."""
    for norm, values in speeds.items():
        for seed, tokens_per_s in enumerate(values):
            run = make_run(
                root, f"{norm}-{seed}", norm=norm, seed=seed, tokens_per_s=tokens_per_s, stats=False
            )
            summary = json.loads((run / "summary.json").read_text())
            summary.update(timed_steps=timed_steps, **summary_fields)
            (run / "summary.json").write_text(json.dumps(summary))
    return root


def throughput_sentence(out) -> str:
    return next(s for s in (out / "summary.md").read_text().splitlines() if s.startswith("- Throughput"))


def test_a_speed_ratio_is_called_from_warm_comparable_runs(tmp_path):
    root = timed_runs(tmp_path, {"ln": [1000.0, 1010.0, 990.0], "rms": [1300.0, 1310.0, 1290.0]})
    out, _ = report([root])
    assert "rms 1.30x ln (faster in these runs)" in throughput_sentence(out)


def test_no_speed_ratio_from_runs_timed_over_too_few_steps(tmp_path):
    root = timed_runs(tmp_path, {"ln": [1000.0, 1010.0, 990.0], "rms": [770.0, 780.0, 760.0]}, timed_steps=5)
    sentence = throughput_sentence(report([root])[0])
    assert "Throughput not compared: a run timed 5 steps past warm-up (fewer than 50)" in sentence
    assert "slower" not in sentence and "0.77x" not in sentence


def test_no_speed_ratio_from_runs_on_different_devices_or_without_timing(tmp_path):
    root = timed_runs(tmp_path / "a", {"ln": [1000.0, 1010.0], "rms": [770.0, 780.0]})
    summary = json.loads((root / "rms-0" / "summary.json").read_text())
    summary["provenance"] = {"device": "cuda", "device_name": "NVIDIA H200"}
    (root / "rms-0" / "summary.json").write_text(json.dumps(summary))
    sentence = throughput_sentence(report([root])[0])
    assert "not compared: the runs differ in provenance.device, provenance.device_name" in sentence
    make_run(tmp_path / "b", "ln", norm="ln", stats=False)  # a summary without timed_steps
    make_run(tmp_path / "b", "rms", norm="rms", stats=False, tokens_per_s=500.0)
    sentence = throughput_sentence(report([tmp_path / "b"])[0])
    assert "not compared: their summaries do not say how many steps were timed" in sentence


def test_a_diverged_run_is_left_out_of_the_speed_ratio(tmp_path):
    root = timed_runs(tmp_path, {"ln": [1000.0, 1010.0, 990.0], "rms": [1300.0, 1310.0, 1290.0]})
    diverged = make_run(root, "rms-lost", norm="rms", seed=3, status="diverged", final=99.0, stats=False)
    summary = json.loads((diverged / "summary.json").read_text())
    summary.update(tokens_per_s=99_000.0, timed_steps=3)
    (diverged / "summary.json").write_text(json.dumps(summary))
    assert "rms 1.30x ln (faster in these runs)" in throughput_sentence(report([root])[0])


def test_the_reports_speed_figure_names_what_it_measures_apart_from_checks(tmp_path):
    """The report's ratio is of whole training steps' tokens/s (higher is faster), and says that
    normbench check's figure is the norm's op alone as a ratio of times: the two are not one number
    read two ways. 1300 / 1000 tokens/s by hand: 1.30x."""
    root = timed_runs(tmp_path, {"ln": [1000.0, 1010.0, 990.0], "rms": [1300.0, 1310.0, 1290.0]})
    out, _ = report([root])
    sentence = throughput_sentence(out)
    assert sentence.startswith(
        "- Throughput against ln (training runs' whole steps: the ratio of mean tokens/s over the completed "
        "runs of each norm, higher is faster; Welch 95% CI of the difference; normbench check times the "
        "norm's op alone, a ratio of times): rms 1.30x ln"
    )

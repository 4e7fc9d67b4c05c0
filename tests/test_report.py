"""normbench.report on fabricated run directories whose numbers are known by hand."""

from __future__ import annotations

import io
import json
import math
import re
import time

import pandas as pd
import pytest
import yaml
from conftest import run_cli
from rich.console import Console

from normbench.core.errors import ConfigError
from normbench.report import CHARTS, default_group_keys, load_runs, run_report
from normbench.report import charts as charts_module
from normbench.report.charts import styles as chart_styles

RUN_CHARTS = [
    "loss_curves",
    "final_loss",
    "grad_by_layer",
    "grad_norm",
    "throughput",
    "stability",
    "tuning",
    "logits",
]
SCALE_CHARTS = ["scale_gap", "scale_best_value", "scale_tuning"]  # with a scale axis only (test_report_scale)
# with per-layer residual variance or layer-skip losses, with ≥ 2 placements' per-layer statistics
# (test_report_depth); with --predict (test_report_predict)
DEPTH_CHARTS, PREDICT_CHARTS = ["depth_profile", "grad_profile"], ["predict"]


def make_run(
    root,
    name,
    *,
    norm="ln",
    placement="pre",
    seed=0,
    lr=0.003,
    n_layer=2,
    status="completed",
    final=2.0,
    best=None,
    floor=1.5,
    tokens_per_s=1000.0,
    stats=True,
    leaks=None,
    summary=True,
    eps=1e-5,
    steps=(10, 20, 30),
    init=4.0,
    threads=0,
    logits=None,
):
    """Write config.yaml, metrics.jsonl and summary.json the way a training run leaves them.

    ``logits``: one (max_attn_logit, max_log_z) per step for the stats records (None: a run from
    before the logit diagnostics); their peaks go to summary.json as training writes them."""
    run = root / name
    run.mkdir(parents=True)
    config = {
        "seed": seed,
        "out_dir": str(run),
        "norm": {"name": norm, "eps": eps, "bias": True},
        "placement": {"name": placement, "final_norm": True},
        "model": {"n_layer": n_layer, "n_head": 2, "d_model": 64, "block_size": 64, "dropout": 0.0},
        "data": {"name": "synthetic", "vocab_size": 64},
        "train": {
            "steps": steps[-1],
            "batch_size": 32,
            "lr": lr,
            "warmup_steps": 3,
            "betas": [0.9, 0.95],
            "threads": threads,
            "progress": threads == 0,
        },
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    lines = [] if init is None else [{"kind": "eval", "step": 0, "val_loss": init}]  # None: an older run
    for i, step in enumerate(steps):
        if stats:
            layers = [
                {
                    "grad_norm": {
                        "attn_in": 1.0,
                        "attn_out": 1.0,
                        "mlp_in": 1.0,
                        "mlp_out": (layer + 1) * (i + 1.0),
                        "norm": 0.1,
                    },
                    "weight_norm": {},
                    "update_ratio": {},
                    "resid_rms": 1.0 + layer,
                }
                for layer in range(n_layer)
            ]
            record = {
                "kind": "stats",
                "step": step - 10,
                "grad_norm": 1.0 + i,
                "clipped": False,
                "layers": layers,
            }
            if logits is not None:
                record.update(
                    max_attn_logit=logits[i][0], max_log_z=logits[i][1], mean_log_z=0.0, max_output_logit=1.0
                )
            lines.append(record)
        lines.append(
            {
                "kind": "train",
                "step": step,
                "train_loss": final + 1.0 - 0.1 * i,
                "lr": lr,
                "tokens_per_s": tokens_per_s,
                "step_ms": 20.0,
                "tokens": step * 2048,
            }
        )
        lines.append({"kind": "eval", "step": step, "val_loss": final + 0.5 - 0.1 * i})
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    if summary:
        s = {
            "status": status,
            "final_val_loss": final,
            "best_val_loss": final if best is None else best,
            "floor_loss": floor,
            "tokens_per_s": tokens_per_s,
            "step_ms_p50": 20.0,
            "step_ms_p90": 25.0,
            "peak_mem_mb": 100.0,
            "mfu": None,
            "wall_s": 1.0,
            "steps": steps[-1],
            "params": 1000,
            "causal_leak": {"train": 0.0, "eval": 0.0},
            "leaks_future": leaks,
            "max_grad_norm": 3.0,
            "clip_fraction": 0.0,
            "error": None,
            "env": {"torch": "2.13"},
        }
        if logits is not None:
            finite = [v for v in logits if all(map(math.isfinite, v))]
            s.update(max_attn_logit=max(v[0] for v in finite), max_log_z=max(v[1] for v in finite))
        (run / "summary.json").write_text(json.dumps(s))
    return run


def only_charts(monkeypatch, *names):
    """Drawing is most of a report's time; tests about tables draw only the charts they check."""
    monkeypatch.setattr(charts_module, "CHARTS", tuple(c for c in CHARTS if c[0] in names))


def quiet():
    return Console(file=io.StringIO(), width=250)


def report(paths, **kwargs):
    console = quiet()
    out = run_report(paths, console=console, **kwargs)
    return out, console.file.getvalue()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """ln/pre seeds 2.0 2.2 2.4; rms/pre seeds 2.0 2.2 plus one diverged run with a huge loss."""
    root = tmp_path_factory.mktemp("sweep")
    for seed, final in enumerate([2.0, 2.2, 2.4]):
        make_run(
            root,
            f"ln_pre_s{seed}",
            norm="ln",
            seed=seed,
            final=final,
            best=final - 0.1,
            tokens_per_s=1000.0 * (seed + 1),
        )
    make_run(root, "rms_pre_s0", norm="rms", eps=1e-6, seed=0, final=2.0)
    make_run(root, "rms_pre_s1", norm="rms", eps=1e-6, seed=1, final=2.2)
    make_run(root, "rms_pre_s2", norm="rms", eps=1e-6, seed=2, final=50.0, status="diverged")
    (root / "bench.csv").write_text(
        "norm,impl,dim,dtype,device,pass,ms,gb_per_s,ratio_to_native\n"
        + "".join(
            f"{n},{impl},{dim},float32,cpu,fwd,{dim / 1000 * (2 if impl == 'native' else 1)},1.0,1.0\n"
            for n in ("ln", "rms")
            for impl in ("normbench", "native")
            for dim in (256, 512, 1024)
        )
    )
    out, text = report([root, root / "bench.csv"])
    return root, out, text


def test_aggregate_numbers_are_exact(sweep):
    _, out, _ = sweep
    agg = pd.read_csv(out / "aggregate.csv")
    assert list(agg["norm"]) == ["rms", "ln"]  # best first: rms 2.1 < ln 2.2
    ln, rms = agg.iloc[1], agg.iloc[0]
    assert ln["final_val_loss_mean"] == pytest.approx(2.2, abs=1e-12)
    assert ln["final_val_loss_std"] == pytest.approx(0.2, abs=1e-12)
    assert ln["final_val_loss_count"] == 3
    assert ln["best_val_loss_mean"] == pytest.approx(2.1, abs=1e-12)
    assert ln["floor_gap_mean"] == pytest.approx(0.7, abs=1e-12)
    assert ln["tokens_per_s_mean"] == pytest.approx(2000.0)
    assert (ln["runs"], ln["completed"], ln["diverged"], ln["failed"]) == (3, 3, 0, 0)
    # the diverged 50.0 is counted, never averaged in
    assert rms["final_val_loss_mean"] == pytest.approx(2.1, abs=1e-12)
    assert rms["final_val_loss_std"] == pytest.approx(math.sqrt(0.02), abs=1e-12)
    assert rms["final_val_loss_count"] == 2
    assert (rms["runs"], rms["completed"], rms["diverged"]) == (3, 2, 1)


def test_summary_csv_md_and_terminal_table(sweep):
    _, out, text = sweep
    runs = pd.read_csv(out / "summary.csv")
    assert len(runs) == 6
    for col in (
        "run_dir",
        "norm",
        "placement",
        "seed",
        "status",
        "final_val_loss",
        "train.lr",
        "causal_leak.train",
    ):
        assert col in runs
    assert sorted(runs["status"]) == ["completed"] * 5 + ["diverged"]
    md = (out / "summary.md").read_text()
    assert "| norm |" in md and "2.200 ± 0.200 (n=3)" in md and "2.100 ± 0.141 (n=2)" in md
    assert text.index("2.100 ± 0.141") < text.index("2.200 ± 0.200")  # terminal: best configuration first


def test_every_chart_drawn_when_data_present(sweep):
    _, out, _ = sweep
    for name in [n for n in RUN_CHARTS if n not in ("stability", "tuning", "logits")] + [
        "bench"
    ]:  # lr is fixed
        assert (out / f"{name}.png").stat().st_size > 1000, name
        assert not (out / f"{name}.svg").exists(), name  # only when asked for
    assert not (out / "stability.png").exists()
    page = (out / "report.html").read_text()
    assert "Stability map" in page and "train.lr does not vary" in page


def test_html_is_self_contained(sweep):
    _, out, _ = sweep
    page = (out / "report.html").read_text()
    assert not re.search(r"(src|href)\s*=\s*['\"]?\s*(https?:)?//", page)
    assert "<script" not in page and "<link" not in page
    sources = re.findall(r"<img[^>]*src='([^']*)'", page)
    assert len(sources) == 6 and all(s.startswith("data:image/png;base64,") for s in sources)


def test_html_escapes_config_values_and_paths(tmp_path, monkeypatch):
    only_charts(monkeypatch, "final_loss")
    evil = "<script>alert(1)</script>"
    make_run(tmp_path / evil, "run", norm=evil + "$x$")  # '$...$' must reach the chart as text, not TeX
    make_run(tmp_path, "ok", norm="ln")
    out, _ = report([tmp_path], out=tmp_path / "out")
    page = (out / "report.html").read_text()
    assert "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_broken_runs_are_skipped_with_a_warning(tmp_path, monkeypatch):
    only_charts(monkeypatch)
    make_run(tmp_path, "good", final=2.0)
    truncated = make_run(tmp_path, "truncated", final=2.4)
    with open(truncated / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 40, "train_lo')
    (make_run(tmp_path, "corrupt_summary") / "summary.json").write_text('{"status": "compl')
    make_run(tmp_path, "running", summary=False)
    mid = make_run(tmp_path, "corrupt_metrics")
    (mid / "metrics.jsonl").write_text('garbage\n{"kind": "eval", "step": 1, "val_loss": 2.0}\n')
    (make_run(tmp_path, "no_metrics") / "metrics.jsonl").unlink()
    make_run(tmp_path / ".hydra_like" / ".hydra", "x", summary=False)  # hidden dirs are not runs

    out, text = report([tmp_path])
    assert out == tmp_path / "report"
    runs = pd.read_csv(out / "summary.csv")
    assert sorted(runs["run_dir"].map(lambda p: p.rsplit("/", 1)[-1])) == ["good", "truncated"]
    agg = pd.read_csv(out / "aggregate.csv")
    assert agg["final_val_loss_mean"].item() == pytest.approx(2.2)
    flat = " ".join(text.split())
    assert "truncated/metrics.jsonl: ignored a truncated last line" in flat
    assert "corrupt_summary: corrupt summary.json" in flat
    assert "running: no summary.json (still running or killed)" in flat
    assert "corrupt_metrics: unreadable metrics.jsonl" in flat
    assert "no_metrics: no metrics.jsonl" in flat
    assert ".hydra" not in flat
    assert "corrupt_summary" in (out / "report.html").read_text()


def test_absent_chart_data_gives_a_note_not_an_empty_chart(tmp_path):
    make_run(tmp_path, "a", norm="ln", stats=False)
    make_run(tmp_path, "b", norm="rms", stats=False)
    out, text = report([tmp_path], formats=("png", "svg"))
    for name in ("loss_curves", "final_loss", "throughput"):
        assert (out / f"{name}.png").exists() and (out / f"{name}.svg").exists()
    # the charts not drawn: one line, after the verdict and the tables, each with why
    (note,) = [line for line in text.splitlines() if "not drawn" in line]
    assert note.startswith("charts not drawn: ") and text.index("Verdict") < text.index(note)
    assert text.index(note) > text.index("groups, by")
    for name in ("grad_by_layer", "grad_norm", "stability", "bench"):
        assert not (out / f"{name}.png").exists() and not (out / f"{name}.svg").exists()
        assert f"{name} (" in note
    assert "grad_by_layer (no per-layer stats records" in note
    page = (out / "report.html").read_text()
    assert "no per-layer stats records" in page and "no bench CSV among the inputs" in page
    for name in SCALE_CHARTS:  # no size compared: no scale charts, and no note about them either
        assert not (out / f"{name}.png").exists() and name not in note
    assert "against size" not in page


def test_stale_charts_from_an_earlier_report_are_removed(tmp_path):
    make_run(tmp_path / "runs", "a", stats=False)
    (tmp_path / "runs" / "report").mkdir()
    (tmp_path / "runs" / "report" / "grad_norm.png").write_bytes(b"old")
    out, _ = report([tmp_path / "runs"])
    assert not (out / "grad_norm.png").exists()


def test_stability_map_and_leaks_future(tmp_path, monkeypatch):
    only_charts(monkeypatch, "stability")
    for lr in (1e-3, 1e-2):
        for seed in (0, 1):
            make_run(tmp_path, f"ln_{lr}_{seed}", norm="ln", lr=lr, seed=seed, final=2.0 + seed * 0.1)
            make_run(
                tmp_path,
                f"bn_{lr}_{seed}",
                norm="bn",
                lr=lr,
                seed=seed,
                leaks=True,
                status="diverged" if lr == 1e-2 else "completed",
                final=float("nan") if lr == 1e-2 else 2.5,
            )
    out, _text = report([tmp_path])
    assert (out / "stability.png").exists()
    agg = pd.read_csv(out / "aggregate.csv")
    assert list(agg.columns[1:3]) == ["norm", "train.lr"]
    bn_high = agg[(agg["norm"] == "bn") & (agg["train.lr"] == 1e-2)].iloc[0]
    assert bn_high["diverged"] == 2 and bn_high["final_val_loss_count"] == 0
    assert math.isnan(bn_high["final_val_loss_mean"])
    assert bool(bn_high["leaks_future"]) is True
    assert agg["config"].iloc[-1] == "bn lr=0.01"  # nothing completed: sorted last
    assert "leaks future" in (out / "summary.md").read_text()


def test_default_group_keys_are_exactly_the_varying_keys(tmp_path):
    make_run(tmp_path, "a", norm="ln", eps=1e-5, placement="pre", lr=1e-3, seed=0)
    make_run(tmp_path, "b", norm="rms", eps=1e-6, placement="post", lr=1e-3, seed=1)
    make_run(tmp_path, "c", norm="ln", eps=1e-5, placement="post", lr=3e-3, seed=2)
    data = load_runs(sorted(p for p in tmp_path.iterdir()), warn=print)
    # seed and out_dir vary but are bookkeeping; norm.eps varies but only follows norm.name
    assert default_group_keys(data.runs, data.config_keys) == ["norm", "placement", "train.lr"]
    make_run(tmp_path, "d", norm="ln", eps=1e-4, placement="pre", lr=1e-3, n_layer=4, seed=3)
    data = load_runs(sorted(p for p in tmp_path.iterdir()), warn=print)
    # now norm.eps splits the ln runs; keys after norm/placement follow the config's order
    expected = ["norm", "placement", "model.n_layer", "norm.eps", "train.lr"]
    assert default_group_keys(data.runs, data.config_keys) == expected


def test_explicit_group_by(tmp_path, monkeypatch):
    only_charts(monkeypatch)
    make_run(tmp_path, "a", norm="ln", placement="pre", final=2.0)
    make_run(tmp_path, "b", norm="ln", placement="post", final=3.0)
    out, _ = report([tmp_path], group_by=["norm.name"], metric="best_val_loss")
    agg = pd.read_csv(out / "aggregate.csv")
    assert len(agg) == 1 and agg["final_val_loss_mean"].item() == pytest.approx(2.5)


def test_user_mistakes_raise_config_error(tmp_path):
    make_run(tmp_path, "a")
    cases = [
        dict(paths=[tmp_path], metric="accuracy"),
        dict(paths=[tmp_path / "nope"]),
        dict(paths=[tmp_path], group_by=["train.momentum"]),
        dict(paths=[tmp_path], formats=("gif",)),
        dict(paths=[tmp_path / "a" / "config.yaml"]),
        dict(paths=[]),
    ]
    for case in cases:
        with pytest.raises(ConfigError):
            run_report(console=quiet(), **case)
    with pytest.raises(ConfigError, match="unknown metric") as e:
        run_report([tmp_path], metric="accuracy", console=quiet())
    assert "final_val_loss" in e.value.allowed
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no run directories found under"):
        run_report([tmp_path / "empty"], console=quiet())
    (tmp_path / "a" / "summary.json").write_text("{torn")
    with pytest.raises(ConfigError, match="none could be read"):
        run_report([tmp_path], console=quiet())
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="not a bench CSV"):
        run_report([tmp_path / "bad.csv"], console=quiet())


def test_older_summaries_with_missing_fields(tmp_path, monkeypatch):
    only_charts(monkeypatch, "final_loss", "throughput")
    run = make_run(tmp_path, "old", final=2.0)
    (run / "summary.json").write_text(json.dumps({"final_val_loss": 2.0}))
    out, _ = report([tmp_path])
    runs = pd.read_csv(out / "summary.csv")
    assert runs["status"].item() == "completed"  # inferred from a finite final loss
    assert (out / "final_loss.png").exists() and not (out / "throughput.png").exists()


def test_200_runs(tmp_path):
    norms, placements, lrs = ("ln", "rms"), ("pre", "post"), (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
    i = 0
    for norm in norms:
        for placement in placements:
            for lr in lrs:
                for seed in range(10):
                    diverged = lr == 1e-1 and placement == "post"
                    make_run(
                        tmp_path,
                        f"r{i:03d}",
                        norm=norm,
                        placement=placement,
                        lr=lr,
                        seed=seed,
                        status="diverged" if diverged else "completed",
                        final=2.0 + lr + 0.01 * seed,
                        steps=tuple(range(10, 310, 10)),
                        logits=[(1.0 + j, 4.0) for j in range(30)],
                    )
                    i += 1
    start = time.perf_counter()
    out, _ = report([tmp_path])
    print(f"report over 200 runs: {time.perf_counter() - start:.2f}s")
    agg = pd.read_csv(out / "aggregate.csv")
    assert len(agg) == 20 and agg["runs"].sum() == 200 and agg["diverged"].sum() == 20
    assert all((out / f"{name}.png").exists() for name in RUN_CHARTS)
    assert not any((out / f"{name}.png").exists() for name in SCALE_CHARTS)  # no size varies
    assert {name for name, _, _ in CHARTS} == {
        *RUN_CHARTS,
        *SCALE_CHARTS,
        *DEPTH_CHARTS,
        *PREDICT_CHARTS,
        "bench",
    }


@pytest.mark.slow  # a sweep's job processes
def test_report_of_a_sweep_with_an_invalid_job_counts_it_as_the_index_does(tmp_path, monkeypatch):
    """A job whose config does not validate fails before training (no metrics.jsonl): still counted."""
    from conftest import TINY

    from normbench.core.runs import read_index
    from normbench.sweeps.sweep import run_sweep

    only_charts(monkeypatch, "final_loss")
    monkeypatch.chdir(tmp_path)
    sweep_dir = tmp_path / "sw"
    code = run_sweep(
        [
            "model.n_head=2,3",
            *TINY,
            "data.train_sequences=64",
            "data.val_sequences=16",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        console=quiet(),
        poll_s=0.2,
    )
    assert code == 1  # n_head=3 does not divide d_model=32
    failed = [r for r in read_index(sweep_dir) if r["status"] == "failed"]
    index_failed = len(failed)
    assert index_failed == 1
    assert not (sweep_dir / failed[0]["run_dir"] / "metrics.jsonl").exists()  # failed before training
    out, text = report([sweep_dir])
    agg = pd.read_csv(out / "aggregate.csv")
    assert agg["failed"].sum() == index_failed and agg["runs"].sum() == 2
    assert "skipped" not in text


def test_pdf_and_svg_charts(tmp_path, monkeypatch):
    only_charts(monkeypatch, "final_loss", "tuning")
    for lr in (1e-3, 1e-2):
        make_run(tmp_path, f"r{lr:g}", lr=lr)
    out, _ = report([tmp_path], formats=("pdf", "svg"))
    for name in ("final_loss", "tuning"):
        assert (out / f"{name}.pdf").read_bytes().startswith(b"%PDF")
        assert b"<svg" in (out / f"{name}.svg").read_bytes()[:500]
        assert (out / f"{name}.png").read_bytes().startswith(b"\x89PNG")  # always: the page embeds it


# --- logit diagnostics and implementation cost ----------------------------------------------------------


def capture_charts(monkeypatch, *names) -> dict:
    """Draw only ``names`` and keep each chart's Figure (or its not-drawn reason) to read its plotted data."""
    drawn = {}

    def keep(name, draw):
        def wrapped(d):
            drawn[name] = draw(d)
            return drawn[name]

        return wrapped

    monkeypatch.setattr(
        charts_module, "CHARTS", tuple((n, t, keep(n, f)) for n, t, f in CHARTS if n in names)
    )
    return drawn


def lines_by_label(ax) -> dict:
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


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


def test_runs_without_logit_records_report_as_before(sweep):
    _, out, text = sweep
    assert not (out / "logits.png").exists()
    assert "charts not drawn: " in text and "logits (no stats record with logit diagnostics" in text
    assert "no stats record with logit diagnostics" in (out / "report.html").read_text()
    assert not any(c.startswith(("max_attn_logit", "max_log_z")) for c in pd.read_csv(out / "aggregate.csv"))
    assert "max attn logit" not in (out / "summary.md").read_text()


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


def test_old_bench_csv_without_ratio_to_ln(sweep, tmp_path, monkeypatch):
    from normbench.report.load import read_bench

    root, _, _ = sweep  # its bench.csv predates ratio_to_ln: derived from its own LayerNorm native rows
    bench = read_bench([root / "bench.csv"])
    rms = bench[bench["norm"].eq("rms") & bench["impl"].eq("normbench")]
    assert list(rms["ratio_to_ln"]) == pytest.approx(
        [0.5, 0.5, 0.5]
    )  # dim/1000 ms over ln native's 2·dim/1000
    drawn = capture_charts(monkeypatch, "bench")
    report([root / "bench.csv"], out=tmp_path / "r1")
    assert lines_by_label(drawn["bench"].axes[0])["rms (normbench)"][1] == pytest.approx([0.5, 0.5, 0.5])
    # no LayerNorm native row either: the times, as before
    (tmp_path / "old.csv").write_text(
        "norm,impl,dim,dtype,device,pass,ms\nrms,normbench,256,fp32,cpu,fwd,0.25\n"
    )
    report([tmp_path / "old.csv"], out=tmp_path / "r2")
    ax = drawn["bench"].axes[0]
    assert ax.get_ylabel() == "time per call (ms)" and lines_by_label(ax)["rms (normbench)"][1] == [0.25]


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

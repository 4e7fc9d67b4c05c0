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
from rich.console import Console

from normbench.core.errors import ConfigError
from normbench.report import CHARTS, default_group_keys, load_runs, run_report
from normbench.report import charts as charts_module

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


def test_runs_without_logit_records_report_as_before(sweep):
    _, out, text = sweep
    assert not (out / "logits.png").exists()
    assert "charts not drawn: " in text and "logits (no stats record with logit diagnostics" in text
    assert "no stats record with logit diagnostics" in (out / "report.html").read_text()
    assert not any(c.startswith(("max_attn_logit", "max_log_z")) for c in pd.read_csv(out / "aggregate.csv"))
    assert "max attn logit" not in (out / "summary.md").read_text()


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


def filtered_runs(tmp_path):
    """ln and rms at lr 0.003 and 0.03, two seeds each; final losses tell them apart."""
    for norm, base in (("ln", 2.0), ("rms", 3.0)):
        for lr, shift in ((0.003, 0.0), (0.03, 0.5)):
            for seed in (0, 1):
                make_run(
                    tmp_path,
                    f"{norm}-{lr}-{seed}",
                    norm=norm,
                    lr=lr,
                    seed=seed,
                    final=base + shift + seed / 10,
                )
    return tmp_path


def test_where_and_exclude_keep_the_runs_whose_config_matches(tmp_path):
    root = filtered_runs(tmp_path)
    out, text = report([root], where=["norm.name=ln"], exclude=["train.lr=3e-2"], tune_key="none")
    runs = pd.read_csv(out / "summary.csv")
    assert sorted(runs["final_val_loss"]) == [2.0, 2.1]  # ln at 0.003 only: 3e-2 matched the stored 0.03
    assert "kept 2 of 8 runs" in text and "kept 2 of 8 runs" in (out / "summary.md").read_text()
    out, _ = report([root], where=["norm=rms", "train.lr=0.003"], out=tmp_path / "r2", tune_key="none")
    assert sorted(pd.read_csv(out / "summary.csv")["final_val_loss"]) == [3.0, 3.1]


def test_a_filter_on_an_unknown_key_names_the_close_keys(tmp_path):
    root = filtered_runs(tmp_path)
    with pytest.raises(ConfigError, match=r"no run's config has the key train\.lrr; close keys: train\.lr"):
        report([root], where=["train.lrr=0.03"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        report([root], exclude=["norm.name"])
    with pytest.raises(ConfigError, match="keeps none of the 8 runs"):
        report([root], where=["norm.name=gn"])


def test_report_filters_on_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from normbench.cli import app

    root = filtered_runs(tmp_path)
    result = CliRunner().invoke(
        app, ["report", str(root), "--where", "norm.name=ln", "--exclude", "train.lr=0.03"]
    )
    assert result.exit_code == 0, result.output
    assert "kept 2 of 8 runs" in result.output
    bad = CliRunner().invoke(app, ["report", str(root), "--where", "train.lrr=1"])
    assert bad.exit_code == 2 and "close keys: train.lr" in bad.output and "Traceback" not in bad.output

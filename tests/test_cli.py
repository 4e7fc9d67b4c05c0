"""The command line as a user meets it: help, Hydra pass-through, bad input, exit codes, install."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from conftest import REPO, run_cli, tiny
from typer.testing import CliRunner

from normbench.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args))


def test_help_lists_commands_groups_and_examples():
    top = invoke("--help")
    assert top.exit_code == 0 and "train" in top.output
    train = invoke("train", "--help")
    assert train.exit_code == 0
    from normbench.core.configtree import group_options

    placements = "deepnorm, hybrid, lns, mixln, ngpt, peri, post, pre, reordered, rezero"
    assert placements == ", ".join(group_options("placement"))
    for text in (
        "norm",
        "bn, derf, dyt, gn, ln, none, rms, scale",
        placements,
        "normbench train norm=rms placement=pre",
    ):
        assert text in " ".join(train.output.split())  # a long list wraps at the terminal's width


def test_cfg_job_passes_through_to_hydra():
    result = invoke("train", "--cfg", "job", "norm=rms", "placement=post", "model.n_layer=3")
    assert result.exit_code == 0
    assert "name: rms" in result.output and "name: post" in result.output and "n_layer: 3" in result.output


def test_train_writes_the_run_directory(tmp_path):
    result = invoke("train", *tiny(), f"hydra.run.dir={tmp_path}")
    assert result.exit_code == 0, result.output
    assert {"config.yaml", "metrics.jsonl", "summary.json"} <= {p.name for p in tmp_path.iterdir()}
    assert "final val loss" in result.output
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"


# (overrides, exit code, message): 2 for normbench's own checks, 1 where Hydra itself refuses (as
# docs/configuration.md says).
BAD_INPUTS = [
    (
        ["norm=foo"],
        1,
        "Could not find 'norm/foo' Available options in 'norm': bn derf dyt gn ln none rms scale",
    ),
    (["placement=sideways"], 1, "Could not find 'placement/sideways' Available options in 'placement'"),
    (["train.nokey=1"], 1, "Could not override 'train.nokey'"),
    (["norm.name=foo"], 2, "unknown norm 'foo'; allowed: bn, derf, dyt, gn, ln, none, rms, scale"),
    (
        ["model.d_model=30", "model.n_head=4"],
        2,
        "model.d_model=30 is not divisible by model.n_head=4; allowed: n_head=1, n_head=2",
    ),
    (["train.steps=0"], 2, "train.steps must be a positive integer, got 0"),
    (["train.batch_size=-2"], 2, "train.batch_size must be a positive integer, got -2"),
    (["model.block_size=0"], 2, "model.block_size must be a positive integer, got 0"),
    (["train.lr=fast"], 2, "train.lr: Value 'fast' of type 'str' could not be converted to Float"),
    (["train.precision=fp8"], 2, "unknown train.precision 'fp8'; allowed: fp32, bf16, fp16"),
    (
        ["train.precision=fp16"],
        2,
        "train.precision=fp16 needs a CUDA device (it trains with a gradient scaler); allowed: fp32, bf16",
    ),
    (["train.device=cuda:7"], 2, "train.device=cuda:7 is not available"),
    (["train.device=tpu"], 2, "unknown train.device 'tpu'; allowed: auto, cpu, cuda, cuda:N"),
    (["data=text"], 2, "data=text needs a file: data.path="),
    (["data=text", "data.path=/nonexistent/file.txt"], 2, "data.path: no such file: /nonexistent/file.txt"),
    (["norm=gn", "norm.groups=5"], 2, "norm.groups=5 must divide the model width"),
    (
        ["train.checkpoint_every=-5"],
        2,
        "train.checkpoint_every must be >= 0 (0 turns checkpoints off), got -5",
    ),
    (["train.resume=maybe"], 2, "unknown train.resume 'maybe'; allowed: auto, never"),
    (["norm.impl=turbo"], 2, "unknown norm.impl 'turbo'; allowed: auto, eager, fused"),
    (
        ["norm=ln", "norm.impl=fused"],
        2,
        "norm.impl=fused: ln cannot run fused on cpu (no fused implementation); allowed: norm.impl=auto, "
        "norm.impl=eager",
    ),
]


@pytest.mark.parametrize("overrides, code, message", BAD_INPUTS)
def test_bad_input_is_a_short_clear_error(tmp_path, overrides, code, message):
    result = invoke("train", *tiny(*overrides), f"hydra.run.dir={tmp_path}")
    assert result.exit_code == code, result.output
    assert message in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output
    summary = tmp_path / "summary.json"
    assert not summary.exists() or json.loads(summary.read_text())["status"] == "failed"
    assert not (tmp_path / "metrics.jsonl").exists(), "nothing trained, so nothing logged"


BAD = [
    (["model.qk_norm=foo"], "unknown model.qk_norm 'foo'; allowed: none, gn, ln, rms, scale"),
    (
        ["model.qk_norm=bn"],
        "model.qk_norm=bn cannot normalize queries and keys (batch statistics, which mix tokens); allowed: "
        "none, gn, ln, rms, scale",
    ),
    (
        ["placement=mixln", "placement.post_fraction=1.5"],
        "placement.post_fraction must be a number in [0, 1], got 1.5",
    ),
    (
        ["placement=mixln", "placement.post_fraction=-0.1"],
        "placement.post_fraction must be a number in [0, 1], got -0.1",
    ),
    (
        ["+placement.post_fraction=0.5"],
        "placement 'pre' has no option post_fraction; allowed: placement.final_norm",
    ),
    (["train.z_loss=-1"], "train.z_loss must be >= 0, got -1"),
    (
        ["placement=ngpt", "model.attn_gate=true"],
        "placement=ngpt keeps every matrix on the unit sphere, where model.attn_gate's x W_g would be a "
        "cosine in [-1, 1], not the gate of Qiu et al. 2025; allowed: model.attn_gate=false",
    ),
]


@pytest.mark.parametrize("overrides, message", BAD)
def test_bad_input_is_one_line(tmp_path, overrides, message):
    result = CliRunner().invoke(app, ["train", *tiny(*overrides), f"hydra.run.dir={tmp_path}"])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow  # a fresh interpreter
def test_help_imports_no_torch():
    """normbench --help must stay fast: importing the CLI and printing help loads neither torch nor Hydra's
    app."""
    code = (
        "import sys\n"
        "from normbench.cli import app\n"
        "try:\n    app(['train', '--help'])\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "print('heavy:', sorted(m for m in ('torch', 'hydra') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Config groups" in result.stdout
    assert result.stdout.strip().endswith("heavy: []"), result.stdout[-300:]


@pytest.mark.parametrize("content", [b"", b"\xc3\x28 not utf-8"])
def test_bad_text_file_through_the_cli(tmp_path, content):
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    result = invoke("train", *tiny("data=text", f"data.path={path}"), f"hydra.run.dir={tmp_path / 'run'}")
    assert result.exit_code == 2 and ("is empty" in result.output or "is not UTF-8" in result.output)


@pytest.mark.slow  # the CLI in a subprocess
def test_real_process_exit_codes_and_no_traceback(tmp_path):
    bad = run_cli("train", *tiny("model.n_head=3"), f"hydra.run.dir={tmp_path / 'bad'}")
    assert bad.returncode == 2
    assert "error:" in bad.stderr and "Traceback" not in bad.stderr + bad.stdout
    diverged = run_cli(
        "train",
        *tiny(
            "norm=none",
            "train.lr=50",
            "train.grad_clip=0",
            "train.warmup_steps=0",
            "train.log_every=1",
            "train.diverge_threshold=6",
        ),
        f"hydra.run.dir={tmp_path / 'div'}",
    )
    assert diverged.returncode == 0, diverged.stderr  # a diverged configuration is a result
    assert json.loads((tmp_path / "div" / "summary.json").read_text())["status"] == "diverged"


@pytest.mark.slow  # builds and installs a wheel
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_wheel_ships_the_configs_and_runs_from_elsewhere(tmp_path):
    """pip install . must carry conf/ inside the package: run the installed wheel from another directory."""
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if build.returncode != 0 and "Could not find a version" in build.stderr + build.stdout:
        pytest.skip("no build backend available offline")
    assert build.returncode == 0, build.stderr
    wheel = next((tmp_path / "dist").glob("normbench-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "normbench/conf/config.yaml" in names and "normbench/conf/norm/rms.yaml" in names
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        timeout=300,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "normbench", "train", "--cfg", "job", "norm=rms"],
        cwd=elsewhere,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "name: rms" in result.stdout


def test_a_crash_while_building_is_one_line_and_an_error_log(tmp_path, monkeypatch):
    import normbench.training.loop

    def broken(*args, **kwargs):
        raise RuntimeError("simulated out of memory")

    monkeypatch.setattr(normbench.training.loop, "GPT", broken)
    result = invoke("train", *tiny(), f"hydra.run.dir={tmp_path}")
    assert result.exit_code == 1
    assert "run failed: RuntimeError: simulated out of memory" in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert "Traceback" in (tmp_path / "error.log").read_text()
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "failed"


def test_bench_writes_a_csv_and_rejects_bad_numbers(tmp_path):
    out = tmp_path / "bench.csv"
    ok = invoke(
        "bench",
        "--norms",
        "ln,rms",
        "--dims",
        "32",
        "--tokens",
        "16",
        "--repeats",
        "2",
        "--no-compile",
        "--out",
        str(out),
    )
    assert ok.exit_code == 0, ok.output
    assert (
        "ln fp32: worst" in ok.output and len(out.read_text().splitlines()) == 1 + 2 * 2 * 2
    )  # header, norms x impls x passes
    for flag, value, message in (
        ("--tokens", "0", "tokens must be >= 1"),
        ("--repeats", "0", "repeats must be >= 1"),
        ("--threads", "0", "threads must be >= 1"),
        ("--dims", "32,x", "--dims takes integers"),
    ):
        bad = invoke("bench", "--dims", "32", "--no-compile", flag, value)
        assert bad.exit_code == 2 and message in bad.output and "Traceback" not in bad.output, (
            flag,
            bad.output,
        )

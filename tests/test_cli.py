"""The command line as a user meets it: help, Hydra pass-through, bad input, exit codes, install."""

from __future__ import annotations

import json
import os
import re
import shlex
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
    assert not (tmp_path / "normbench.log").exists()  # the run's record is the files above
    assert "final val loss" in result.output
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"
    assert result.output.rstrip().endswith(f"run directory: {tmp_path}")  # under the closing table


def _files(run_dir) -> dict:
    """Every file of a run directory (Hydra's .hydra/ included) and its bytes."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_a_run_directory_never_loses_a_result(tmp_path, monkeypatch):
    """The same config again: said to be there already, nothing trained; another config: refused, the
    directory byte for byte as it was; train.resume=never: trained again from nothing."""
    monkeypatch.chdir(tmp_path)
    first = invoke("train", *tiny(), "hydra.run.dir=runs/a")
    assert first.exit_code == 0, first.output
    run_dir = tmp_path / "runs" / "a"
    before = _files(run_dir)

    again = invoke("train", *tiny(), "hydra.run.dir=runs/a")
    assert again.exit_code == 0, again.output
    assert "already completed with this config: runs/a" in again.output
    assert "final val loss" not in again.output  # nothing trained
    assert _files(run_dir) == before

    other = invoke("train", *tiny("norm=rms", "train.steps=10"), "hydra.run.dir=runs/a")
    assert other.exit_code == 2
    assert len(other.output.strip().splitlines()) == 1, other.output
    assert "runs/a holds a completed run of another config" in other.output
    assert _files(run_dir) == before  # summary.json and Hydra's .hydra/ alike
    never = invoke("train", *tiny("norm=rms", "train.resume=never"), "hydra.run.dir=runs/a")
    assert never.exit_code == 2 and _files(run_dir) == before  # train.resume=never replaces no other's result

    retrained = invoke("train", *tiny("train.resume=never"), "hydra.run.dir=runs/a")
    assert retrained.exit_code == 0, retrained.output
    assert "final val loss" in retrained.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_at"] == []
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 10, 20]  # one run's log, not two


# (overrides, exit code, message): 2 for a mistake in the command line, Hydra's included.
BAD_INPUTS = [
    (["norm=foo"], 2, "unknown norm 'foo' (choices: bn, derf, dyt, gn, ln, none, rms, scale)"),
    (["placement=sideways"], 2, "unknown placement 'sideways' (choices: deepnorm, hybrid,"),
    (["train.nokey=1"], 2, "unknown key train.nokey; normbench train --cfg job shows every key"),
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
def test_bad_input_is_a_short_clear_error_and_leaves_no_run_directory(tmp_path, overrides, code, message):
    run_dir = tmp_path / "run"
    result = invoke("train", *tiny(*overrides), f"hydra.run.dir={run_dir}")
    assert result.exit_code == code, result.output
    assert message in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output
    assert not run_dir.exists(), "a config error is no run: results/ holds runs only"


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
    (
        ["placement=peri", "placement.embedding_norm=3"],
        "placement.embedding_norm must be true or false, got 3; allowed: false, true",
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
    result = CliRunner().invoke(app, ["train", *tiny(*overrides), f"hydra.run.dir={tmp_path / 'run'}"])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "run").exists()


MISTYPED = [
    (["train.step=5"], "unknown key train.step; did you mean train.steps?"),
    (["+train.step=5"], "unknown key train.step; did you mean train.steps?"),
    (["model.n_layr=3"], "unknown key model.n_layr; did you mean model.n_layer?"),
    (["nrom=rms"], "unknown key nrom; did you mean norm?"),
    (
        ["norm=rsm"],
        "unknown norm 'rsm'; did you mean rms? (choices: bn, derf, dyt, gn, ln, none, rms, scale)",
    ),
    (
        ["norm=ln,rms"],
        "'norm=ln,rms' is a list of values, and this command runs one configuration: use normbench sweep",
    ),
    (
        ["--multirun", "norm=ln,rms"],
        "train runs one configuration: run a grid with normbench sweep model=tiny",
    ),
    (["-m", "norm=ln,rms"], "train runs one configuration: run a grid with normbench sweep model=tiny"),
]


@pytest.mark.parametrize("overrides, message", MISTYPED)
def test_a_mistyped_key_or_option_says_the_closest_in_one_line(tmp_path, overrides, message):
    result = invoke("train", *tiny(*overrides), f"hydra.run.dir={tmp_path}")
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    assert message in result.output, result.output
    assert "+train" not in result.output and "search path" not in result.output
    assert not (tmp_path / "metrics.jsonl").exists()
    assert "hydra.run.dir" not in result.output


def test_config_dir_and_version_on_every_command(tmp_path):
    conf = tmp_path / "myconf"
    (conf / "model").mkdir(parents=True)
    micro = (REPO / "conf" / "model" / "micro.yaml").read_text()
    (conf / "model" / "wee.yaml").write_text(micro.replace("n_layer: 2", "n_layer: 1"))
    for command in ("train", "sweep", "check", "coordcheck"):
        shown = invoke(command, "--help")
        assert shown.exit_code == 0 and "--config-dir" in shown.output, command
    yours = invoke("train", "--config-dir", str(conf), "--help")
    assert "yours: wee" in " ".join(yours.output.split())
    assert "yours:" not in invoke("train", "--help").output
    composed = invoke("train", "--config-dir", str(conf), "--cfg", "job", "model=wee")
    assert composed.exit_code == 0 and "n_layer: 1" in composed.output, composed.output
    after = invoke("train", "--config-dir", str(conf), "model=wee", "--cfg", "job")  # overrides, then a flag
    assert after.exit_code == 0 and "n_layer: 1" in after.output, after.output
    planned = invoke("sweep", "--config-dir", str(conf), "--dry-run", *tiny("model=wee", "seed=0,1"))
    assert planned.exit_code == 0, planned.output
    assert "2 runs" in planned.output, planned.output
    missing = invoke("sweep", "--config-dir", str(tmp_path / "nope"), "--dry-run", "seed=0,1")
    assert missing.exit_code == 2 and "--config-dir" in missing.output and "no such folder" in missing.output

    version = invoke("--version")
    declared = re.search(r'(?m)^version = "(.+)"', (REPO / "pyproject.toml").read_text())[1]
    assert version.exit_code == 0 and version.output == f"normbench {declared}\n"


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
    assert f"wrote {out} (8 rows;" in " ".join(ok.output.split())
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


def test_a_mistake_inside_nested_subjects_is_said_of_each_outermost_first():
    from normbench.core.errors import ConfigError, about

    with pytest.raises(ConfigError) as err, about("claim.yaml"), about("sweep"):
        raise ConfigError("unknown norm 'lnn'", allowed=["ln", "rms"])
    assert str(err.value) == "claim.yaml: sweep: unknown norm 'lnn'; allowed: ln, rms"
    assert err.value.allowed == ["ln", "rms"]
    with about("elsewhere"):
        pass
    assert str(ConfigError("bad")) == "bad"  # outside every block, said of nothing


def test_a_qk_norm_that_cannot_be_built_at_the_head_width_names_the_key_and_width(tmp_path):
    run = tmp_path / "run"
    result = run_cli(
        "train", *tiny("model.qk_norm=gn", "model.d_model=84", "model.n_head=2"), f"hydra.run.dir={run}"
    )
    assert result.returncode == 2 and not run.exists()
    assert "Traceback" not in result.stderr
    assert (
        "error: model.qk_norm=gn over 42 channels: norm.groups=4 must divide the model width 42"
        in " ".join(result.stderr.split())
    )


def test_a_config_dirs_resume_command_pastes_without_quotes_inside_quotes(tmp_path):
    """The search path a plain folder becomes is a plain Hydra value, so the printed command needs one
    pair of shell quotes; a folder with a space is quoted for Hydra and still composes."""
    from normbench.cli import _with_config_dir

    plain = tmp_path / "my_conf"
    (plain / "model").mkdir(parents=True)
    (plain / "model" / "wee.yaml").write_text((REPO / "conf" / "model" / "micro.yaml").read_text())
    args = _with_config_dir(["seed=0,1"], plain)
    printed = shlex.join(["normbench", "sweep", *args])
    assert "'\"'\"'" not in printed and shlex.split(printed)[2:] == args
    assert args[-1] == f"hydra.searchpath=[file://{plain.resolve()}]"
    spaced = tmp_path / "my conf"
    shutil.copytree(plain, spaced)
    for folder in (plain, spaced):
        composed = invoke("train", "--config-dir", str(folder), "--cfg", "job", "model=wee")
        assert composed.exit_code == 0 and "n_layer: 2" in composed.output, composed.output

"""A plain install works: the built wheel, without extras, in a fresh virtual environment, from any
folder.

The rest of the suite runs with every extra installed, so it cannot see a command that needs one
(joblib, say) when it should not. Here the wheel (with its Hydra plugins and config tree) goes into
a venv of its own with PyTorch and the required dependencies only, and a new user's first commands
run there: train, sweep with the default launcher, report, coordcheck, bench; a command that needs
an extra says which to install, in one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import skip_unless_ci

ROOT = Path(__file__).resolve().parents[1]
MICRO = ["model=micro", "train.steps=6", "train.eval_every=3", "train.eval_batches=1", "train.log_every=3"]


def _run(*cmd, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> tuple[Path, Path]:
    """(the venv's bin folder, an empty working folder) with normbench's wheel installed without extras."""
    tmp = tmp_path_factory.mktemp("plain")
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp / "dist", ROOT, cwd=tmp)
    if built.returncode:
        skip_unless_ci(f"cannot build the wheel here (no build backend to be had?): {built.stderr[-300:]}")
    _run(sys.executable, "-m", "venv", tmp / "venv", cwd=tmp).check_returncode()
    bin_ = tmp / "venv" / "bin"
    torch = f"torch=={__import__('torch').__version__.split('+')[0]}"  # the one on this disk: no download
    for what in ([torch], [next((tmp / "dist").glob("normbench-*.whl"))]):
        installed = _run(bin_ / "python", "-m", "pip", "install", "-q", *what, cwd=tmp)
        if installed.returncode:
            skip_unless_ci(f"cannot install {what[0]} into a fresh venv here: {installed.stderr[-300:]}")
    work = tmp / "work"
    work.mkdir()
    return bin_, work


@pytest.mark.slow  # builds a wheel and installs it with its dependencies into a fresh venv
def test_the_plain_wheel_has_no_extras_and_every_command_runs(plain):
    bin_, work = plain
    assert _run(bin_ / "python", "-c", "import joblib", cwd=work).returncode == 1  # really without extras

    trained = _run(bin_ / "normbench", "train", *MICRO, "hydra.run.dir=run", cwd=work)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert (work / "run" / "summary.json").exists()

    swept = _run(bin_ / "normbench", "sweep", "norm=ln,rms", "seed=0,1", *MICRO, cwd=work)
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert "4 runs: 4 completed" in " ".join(swept.stdout.split())
    (sweep_dir,) = (work / "results" / "sweeps").iterdir()

    reported = _run(bin_ / "normbench", "report", sweep_dir, cwd=work)
    assert reported.returncode == 0, reported.stdout + reported.stderr
    assert (sweep_dir / "report" / "report.html").exists()

    coord = _run(
        bin_ / "normbench", "coordcheck", "model=micro", "--widths", "32,64", "--steps", "1",
        "--out", "coord", cwd=work,
    )  # fmt: skip
    assert coord.returncode == 0, coord.stdout + coord.stderr
    assert (work / "coord" / "coordcheck.csv").exists()

    bench = _run(
        bin_ / "normbench", "bench", "--dims", "64", "--tokens", "64", "--norms", "ln,rms", "--no-compile",
        "--repeats", "2", "--out", "bench.csv",
        cwd=work,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stdout + bench.stderr
    assert (work / "bench.csv").exists()


@pytest.mark.slow  # the plain install above
@pytest.mark.parametrize(
    "command, extra",
    [
        (["sweep", "norm=ln,rms", "hydra/launcher=joblib"], "joblib"),
        (["sweep", "norm=ln,rms", "hydra/launcher=slurm"], "slurm"),
        (["train", "logger=mlflow"], "mlflow"),
    ],
    ids=["joblib", "slurm", "mlflow"],
)
def test_a_command_that_needs_an_extra_says_which_to_install_in_one_line(plain, command, extra):
    bin_, work = plain
    result = _run(bin_ / "normbench", *command, *MICRO, cwd=work)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and f"pip install 'normbench[{extra}]'" in lines[0], lines

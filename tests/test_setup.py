"""The scripts a new user runs first: the PyTorch build setup.sh installs fits the machine
(scripts/torch_choice.sh), and scripts/demo.sh keeps runs with other overrides apart.

A stand-in ``nvidia-smi`` on PATH plays the GPU (present, absent, failing); a local HTTP server plays
PyTorch's CPU index, a closed localhost port an index that cannot be reached. Nothing is installed:
demo.sh runs in a copy of scripts/ with a stand-in setup.sh and a .venv/bin/python that records its
commands.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "torch_choice.sh"
BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")


class _Index(BaseHTTPRequestHandler):
    def do_HEAD(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def index():
    server = HTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/whl/cpu"
    server.shutdown()


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    return f"http://127.0.0.1:{port}/whl/cpu"


def choose(tmp_path: Path, nvidia_smi: str | None, index_url: str, **env) -> tuple[list[str], str]:
    """(the pip arguments, the line on stderr) with PATH holding python3 and the stand-in nvidia-smi only."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").symlink_to(os.path.realpath(sys.executable))  # the interpreter, not a pyenv shim
    if nvidia_smi is not None:
        (bin_ / "nvidia-smi").write_text(f"#!{BASH}\n{nvidia_smi}\n")
        (bin_ / "nvidia-smi").chmod(0o755)
    full_env = {
        "PATH": str(bin_),
        "HOME": os.environ.get("HOME", "/"),
        "NORMBENCH_TORCH_CPU_INDEX": index_url,
    }
    done = subprocess.run(
        [BASH, str(SCRIPT)], env={**full_env, **env}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # the choice, said in one line
    return done.stdout.split("\n")[:-1], done.stderr.strip()


def test_no_gpu_installs_the_cpu_build_from_its_index(tmp_path, index):
    args, said = choose(tmp_path, None, index)
    assert args == ["--index-url", index, "torch>=2.4"]
    assert "CPU build" in said and "no NVIDIA GPU" in said


def test_a_failing_nvidia_smi_is_no_gpu(tmp_path, index):
    args, said = choose(tmp_path, "echo 'NVIDIA-SMI has failed' >&2; exit 9", index)
    assert args == ["--index-url", index, "torch>=2.4"]
    assert "NVIDIA-SMI" not in said


def test_a_gpu_gets_the_default_index_cuda_build(tmp_path, index):
    args, said = choose(tmp_path, "echo 'GPU 0: NVIDIA H100 (UUID: GPU-1)'", index)
    assert args == ["torch>=2.4"]
    assert "CUDA build" in said


def test_an_unreachable_cpu_index_falls_back_to_the_default_index(tmp_path):
    url = closed_port()
    args, said = choose(tmp_path, None, url)
    assert args == ["torch>=2.4"]
    assert f"{url} cannot be reached" in said


@pytest.mark.parametrize("nvidia_smi", [None, "echo 'GPU 0: NVIDIA H100'"])
def test_normbench_torch_wins_and_chooses_no_index(tmp_path, index, nvidia_smi):
    args, said = choose(tmp_path, nvidia_smi, index, NORMBENCH_TORCH="torch==2.13.0")
    assert args == ["torch==2.13.0"]
    assert "NORMBENCH_TORCH" in said


def demo(tmp_path: Path, *overrides: str) -> list[str]:
    """The commands demo.sh gives normbench for these extra overrides."""
    (tmp_path / "scripts").mkdir(exist_ok=True)
    shutil.copy(SCRIPT.parent / "demo.sh", tmp_path / "scripts" / "demo.sh")
    (tmp_path / "scripts" / "setup.sh").write_text(f"#!{BASH}\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
    (tmp_path / ".venv" / "bin" / "python").write_text(f'#!{BASH}\necho "$*" >> "$(dirname "$0")/../log"\n')
    for script in (tmp_path / "scripts" / "setup.sh", tmp_path / ".venv" / "bin" / "python"):
        script.chmod(0o755)
    (tmp_path / ".venv" / "log").unlink(missing_ok=True)
    done = subprocess.run(
        [BASH, str(tmp_path / "scripts" / "demo.sh"), *overrides], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return (tmp_path / ".venv" / "log").read_text().splitlines()


def test_demo_with_other_overrides_names_its_own_directory(tmp_path):
    sweep, report = demo(tmp_path)
    assert "hydra.sweep.dir=results/sweeps/demo" in sweep.split() and report.endswith(
        "report results/sweeps/demo"
    )
    sweep, report = demo(tmp_path, "train.steps=500", "model=mini")
    where = re.search(r"hydra\.sweep\.dir=(results/sweeps/demo-[0-9a-f]{8}) ", sweep)[1]
    assert sweep.endswith("train.steps=500 model=mini") and report.endswith(f"report {where}")
    assert (
        demo(tmp_path, "train.steps=500", "model=mini")[0] == sweep
    )  # the same overrides, the same directory
    assert where not in demo(tmp_path, "train.steps=600", "model=mini")[0]

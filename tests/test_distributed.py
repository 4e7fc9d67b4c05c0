"""Data-parallel training: 2 gloo processes on loopback train what 1 process trains.

The 2-rank runs go through the real launcher (``python -m torch.distributed.run
--standalone ... -m normbench train``), each in an empty working directory and with
its own TMPDIR, so stray files and leftover scratch directories show up.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import REPO, TINY, compose_cfg, read_metrics, run_cli, train_tiny
from torch.nn.parallel import DistributedDataParallel

from normbench.core.errors import ConfigError
from normbench.model.norms import build_norm
from normbench.training import distributed

TIMEOUT_S = 180
# The small corpus, spelled out: both runs of a comparison must train on the same data.
CORPUS = ["data.train_sequences=128", "data.val_sequences=32"]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts its workers in sessions of their own)."""
    parent_of = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent_of[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parent_of.items() if parent == frontier.pop()]
        found += children
        frontier += children
    return found


def start_torchrun(
    tmp_path: Path, *overrides: str, nproc: int = 2, pythonpath: tuple[Path, ...] = ()
) -> tuple[str, Path, int, float]:
    """Train under torchrun in an empty working directory; return (console output, that directory,
    torchrun's exit code, seconds it took)."""
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO), *map(str, pythonpath), os.environ.get("PYTHONPATH")])
        ),
        "PYTHONUNBUFFERED": "1",
        "TMPDIR": str(tmp),
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "normbench",
        "train",
        *TINY,
        *CORPUS,
        "train.threads=1",
        *overrides,
    ]
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        out = "(timed out)"
    finally:
        if proc.poll() is None:  # timed out or interrupted: take the workers down with torchrun
            for pid in [*_descendants(proc.pid), proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
    return out, cwd, proc.returncode, time.monotonic() - started


def torchrun(tmp_path: Path, *overrides: str, nproc: int = 2) -> tuple[str, Path]:
    """A run under torchrun that must succeed; return (console output, its working directory)."""
    out, cwd, code, _ = start_torchrun(tmp_path, *overrides, nproc=nproc)
    assert code == 0, out
    assert not list((tmp_path / "tmp").glob("normbench-*")), "a rank's scratch directory was left behind"
    return out, cwd


def curve(run_dir: Path, kind: str, key: str) -> list[float]:
    return [r[key] for r in read_metrics(run_dir) if r["kind"] == kind]


@pytest.mark.slow  # torchrun
@pytest.mark.parametrize("norm", ["ln", "bn"])
def test_two_ranks_train_the_same_curve_as_one(tmp_path, norm):
    one = train_tiny(tmp_path / "one", *CORPUS, f"norm={norm}")
    out, cwd = torchrun(tmp_path, f"norm={norm}", "train.progress=true")

    # One run directory, Hydra's default one, written by rank 0 alone; nothing else in the working directory.
    assert [p.name for p in cwd.iterdir()] == ["results"]
    runs = list((cwd / "results" / "runs").iterdir())
    assert len(runs) == 1, runs
    two_dir = runs[0]
    assert {p.name for p in two_dir.iterdir()} == {
        ".hydra",
        ".lock",
        "config.yaml",
        "metrics.jsonl",
        "summary.json",
    }
    assert out.count("run completed") == 1 and out.count("20/20") == 1, (
        out
    )  # one summary table, one progress bar

    two = json.loads((two_dir / "summary.json").read_text())
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert one["sync_batchnorm"] == two["sync_batchnorm"] == (True if norm == "bn" else None)
    assert two["status"] == "completed"

    assert curve(two_dir, "train", "step") == curve(tmp_path / "one", "train", "step")
    assert curve(two_dir, "train", "train_loss") == pytest.approx(
        curve(tmp_path / "one", "train", "train_loss"), rel=1e-5
    )
    # BatchNorm's val loss is looser: the biases in front of a BatchNorm get an exactly-zero gradient,
    # AdamW turns its float noise into lr-sized steps, and those move the running means that eval
    # uses. One process with 1 vs 2 threads differs by the same ~1e-4; the train-mode loss is immune.
    val_rel = 1e-3 if norm == "bn" else 1e-5
    assert curve(two_dir, "eval", "val_loss") == pytest.approx(
        curve(tmp_path / "one", "eval", "val_loss"), rel=val_rel
    )
    assert two["causal_leak"]["eval"] < 1e-4
    if norm == "bn":  # every rank probes the same tokens, so the synchronized statistics are one rank's
        assert two["causal_leak"]["train"] == pytest.approx(one["causal_leak"]["train"], rel=1e-2)


@pytest.mark.slow  # torchrun
def test_two_ranks_in_micro_batches_train_the_same_curve_as_one_with_the_whole_batch(tmp_path):
    """train.micro_batch_size under DDP: each rank's half of the batch in micro-batches of 2, the
    gradients all-reduced once per step, trains what one process trains on the whole batch."""
    exact = ("model.dropout=0.0", "train.stats_every=5")
    one = train_tiny(tmp_path / "one", *CORPUS, *exact)
    _, cwd = torchrun(tmp_path, *exact, "train.micro_batch_size=2")
    two_dir = next((cwd / "results" / "runs").iterdir())
    assert json.loads((two_dir / "summary.json").read_text())["world_size"] == 2
    for kind, key in (("train", "train_loss"), ("eval", "val_loss"), ("stats", "grad_norm")):
        want = curve(tmp_path / "one", kind, key)
        assert len(want) >= 2 and curve(two_dir, kind, key) == pytest.approx(want, rel=1e-4), kind
    assert one["status"] == "completed"


def test_micro_steps_keep_their_gradients_local_until_the_last_all_reduces_the_sum():
    """Under DDP every micro-step but the last skips the all-reduce (no_sync): one reduction per
    update, of the gradients summed over the micro-steps (a comm hook counts the reductions)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Linear(4, 2))
        reduced = []

        def count(state, bucket):
            reduced.append(bucket.index())
            done = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done

        model.register_comm_hook(None, count)
        x = torch.randn(3, 4)
        for i in range(3):
            with distributed.gradients_kept_local(model, i < 2):
                model(x[i : i + 1]).sum().backward()
            assert len(reduced) == (0 if i < 2 else 1), i
        # d/dW of sum(W x + b) over the three inputs: each output row's gradient is the inputs' sum
        assert torch.allclose(model.module.weight.grad, x.sum(0).expand(2, 4))
        assert torch.allclose(model.module.bias.grad, torch.full((2,), 3.0))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # torchrun
def test_unsynchronized_batchnorm_keeps_per_rank_statistics(tmp_path):
    short = ["train.steps=5", "train.eval_every=5"]  # one logged window shows the difference
    train_tiny(tmp_path / "one", *CORPUS, "norm=bn", *short)
    _, cwd = torchrun(tmp_path, "norm=bn", "norm.sync=false", *short, f"hydra.run.dir={tmp_path / 'two'}")
    assert not list(cwd.iterdir()), "hydra.run.dir given: nothing may land in the working directory"
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["world_size"] == 2 and summary["sync_batchnorm"] is False
    # Statistics over 4 sequences per rank instead of all 8: a different computation from the first step.
    one, two = curve(tmp_path / "one", "train", "train_loss"), curve(tmp_path / "two", "train", "train_loss")
    assert two != pytest.approx(one, rel=1e-4)


@pytest.mark.slow  # the CLI in a subprocess
def test_a_sweep_under_torchrun_is_refused_with_a_pointer_to_the_launchers(tmp_path):
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "PYTHONPATH": str(REPO)}
    result = run_cli("train", "-m", *TINY, *CORPUS, "seed=0,1", cwd=tmp_path, env=env, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "not a sweep" in result.stderr and "Scaling out" in result.stderr


@pytest.fixture
def two_rank_env(monkeypatch):
    """Rank 1 of 2 as torchrun describes it, without starting a process group."""
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)


def test_each_rank_keeps_its_contiguous_slice_of_the_global_batch(two_rank_env):
    assert distributed.launched() and distributed.rank() == 1 and not distributed.is_main()
    assert distributed.shard(torch.arange(8)).tolist() == [4, 5, 6, 7]


def test_a_global_batch_that_does_not_split_evenly_is_a_config_error(two_rank_env):
    with pytest.raises(ConfigError, match=r"batch_size=9 .* 2 processes; allowed: 8, 10"):
        distributed.local_batch_size(9)


def test_one_process_is_untouched(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    batch = torch.arange(6)
    assert distributed.shard(batch) is batch and distributed.world_size() == 1 and distributed.is_main()
    assert distributed.all_mean(batch) is batch


def test_sync_is_a_batchnorm_option_only():
    assert build_norm("bn", 4).sync is True and build_norm("bn", 4, sync=False).sync is False
    with pytest.raises(ConfigError, match="norm.sync must be true or false"):
        build_norm("bn", 4, sync="sometimes")
    with pytest.raises(ConfigError, match="norm 'ln' has no option sync"):
        build_norm("ln", 4, sync=True)
    assert compose_cfg(["norm=bn"]).norm.sync is True


@pytest.mark.slow  # torchrun
def test_two_ranks_stopped_by_sigterm_resume_exactly(tmp_path):
    """torchrun passes SIGTERM to both ranks; they agree on a step, checkpoint (every rank's dropout RNG)
    and exit; the same command resumes both ranks from rank 0's file and ends as an uninterrupted run."""
    run = ["model.dropout=0.1", "train.steps=30", "train.eval_every=10", "train.log_every=2"]
    (tmp_path / "ref").mkdir()
    (tmp_path / "resume").mkdir()
    torchrun(tmp_path / "ref", *run, "train.checkpoint_every=0", f"hydra.run.dir={tmp_path / 'ref' / 'run'}")
    run_dir = tmp_path / "run"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "normbench",
        "train",
        *TINY,
        *CORPUS,
        "train.threads=1",
        *run,
        "train.checkpoint_every=10",  # one mid-run, the signal sent once it is on disk
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + TIMEOUT_S
        while not (run_dir / "checkpoint.pt").exists():
            assert proc.poll() is None and time.time() < deadline, "no checkpoint came"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            for pid in [*_descendants(proc.pid), proc.pid]:
                os.kill(pid, signal.SIGKILL)
            proc.wait()
    assert not (run_dir / "summary.json").exists(), out
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert len(saved["rng"]) == 2 and saved["step"] >= 10
    torchrun(tmp_path / "resume", *run, f"hydra.run.dir={run_dir}")
    timing = ("tokens_per_s", "step_ms")
    strip = lambda d: [{k: v for k, v in r.items() if k not in timing} for r in read_metrics(d)]
    assert strip(run_dir) == strip(tmp_path / "ref" / "run")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_at"] and summary["world_size"] == 2


# A user's norm that fails on rank 1 only, after the first evaluation (its training forward of step 1).
FAILS_ON_RANK_1 = """
import os
import torch
from torch import nn


class FailsOnRank1(nn.Module):
    statistics = "token"

    def __init__(self, dim, *, eps: float = 1e-5, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        if self.training and os.environ["RANK"] == "1":
            raise RuntimeError("planted failure on rank 1")
        return nn.functional.rms_norm(x, x.shape[-1:], self.weight)
"""


@pytest.mark.slow  # torchrun
def test_a_completed_run_started_again_under_torchrun_ends_every_rank_at_once(tmp_path):
    """Rank 0 finds the result and says so; the other ranks end with it instead of waiting for it in the
    process group until its timeout. A run of another config there ends them too, with rank 0's refusal."""
    run_dir = tmp_path / "run"
    for name in ("first", "again", "other"):
        (tmp_path / name).mkdir()
    torchrun(tmp_path / "first", f"hydra.run.dir={run_dir}")
    summary = (run_dir / "summary.json").read_bytes()
    out, _, code, seconds = start_torchrun(tmp_path / "again", f"hydra.run.dir={run_dir}")
    assert code == 0 and seconds < 60, out
    assert "already completed with this config" in out
    out, _, code, seconds = start_torchrun(tmp_path / "other", "norm=rms", f"hydra.run.dir={run_dir}")
    assert code != 0 and seconds < 60, out  # torchrun's own code for a failed rank is 1
    assert "of another config" in out and re.search(r"exitcode\s*: 2", out), out
    assert (run_dir / "summary.json").read_bytes() == summary


@pytest.mark.slow  # torchrun
def test_a_failure_on_one_rank_ends_every_rank_at_once(tmp_path):
    """The failing rank exits at once with its error; torchrun stops the other rank, which would
    otherwise wait in the gradient all-reduce rank 1 never joins (under NCCL, until its timeout)."""
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "nb_fails.py").write_text(FAILS_ON_RANK_1)
    out, _, code, seconds = start_torchrun(
        tmp_path,
        "train.steps=200",
        "norm.name=fails",
        "+norm._target_=nb_fails.FailsOnRank1",
        pythonpath=(tmp_path / "user",),
    )
    assert code != 0, out
    assert seconds < 120, out  # far below any collective timeout (gloo's: 30 minutes)
    assert "planted failure on rank 1" in out
    # Whichever rank reports, it reports in its own words: an error naming a path in brackets is no
    # markup to choke on.
    assert "MarkupError" not in out and "Error executing job" not in out, out

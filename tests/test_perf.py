"""Step-time percentiles, the summary's performance fields and peak FLOPs, and process-wide state that must
not leak from one run into the next."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import train_tiny

from normbench.training.perf import StepTimer


@pytest.mark.parametrize("n", [2, 3, 10, 11, 20, 37])
def test_step_time_percentiles_match_numpy(n):
    rng = np.random.default_rng(n)
    timer = StepTimer(warmup_steps=0)
    timer.times = list(rng.uniform(0.001, 0.05, size=n))
    speed = timer.summary(tokens_per_step=100)
    ms = 1000 * np.array(timer.times)
    assert speed["step_ms_p50"] == pytest.approx(np.percentile(ms, 50), rel=1e-12)
    assert speed["step_ms_p90"] == pytest.approx(np.percentile(ms, 90), rel=1e-12)
    assert speed["tokens_per_s"] == pytest.approx(100 / (np.median(ms) / 1000), rel=1e-12)


def test_step_timer_excludes_warmup():
    timer = StepTimer(warmup_steps=2)
    timer.times = [1.0, 1.0, 0.01, 0.02, 0.03]
    out = timer.summary(tokens_per_step=100)
    assert out["step_ms_p50"] == pytest.approx(20.0)
    assert out["tokens_per_s"] == pytest.approx(100 / 0.02)
    assert out["step_ms_p90"] == pytest.approx(28.0)  # 0.9 of the way from 10 to 30: 20 + 0.8 x 10


def test_summary_performance_fields(tmp_path):
    summary = train_tiny(tmp_path, "train.peak_flops=1e12")
    for key in (
        "tokens_per_s",
        "step_ms_p50",
        "step_ms_p90",
        "peak_mem_mb",
        "mfu",
        "max_grad_norm",
        "clip_fraction",
    ):
        assert summary[key] is not None and summary[key] >= 0, key
    assert summary["step_ms_p90"] >= summary["step_ms_p50"]
    # MFU is model FLOPs per second over the given peak.
    assert summary["mfu"] == pytest.approx(
        summary["tokens_per_s"] * summary["flops_per_token"] / 1e12, rel=1e-6
    )
    assert (summary["peak_flops"], summary["peak_flops_source"]) == (1e12, "train.peak_flops")


def test_peak_flops_on_a_listed_gpu_is_its_datasheet_figure(monkeypatch):
    """No GPU needed: the name decides, and nothing is measured."""
    import normbench.training.perf as perf

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(
        perf, "_measure_matmul_flops", lambda *a, **k: pytest.fail("a listed GPU is not measured")
    )
    cuda = torch.device("cuda")
    assert perf.peak_flops(cuda, torch.bfloat16) == (989.4e12, "datasheet bf16: NVIDIA H100 80GB HBM3")
    assert perf.peak_flops(cuda, torch.float16)[0] == 989.4e12
    precision = torch.get_float32_matmul_precision()  # what allow_tf32 sets (not monkeypatch-able)
    try:
        for tf32, peak in ((True, 494.7e12), (False, 66.9e12)):  # fp32 matmuls on tensor cores only with TF32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            assert perf.peak_flops(cuda, torch.float32)[0] == peak
    finally:
        torch.set_float32_matmul_precision(precision)
    assert perf.peak_flops(cuda, torch.bfloat16, setting=5e14) == (5e14, "train.peak_flops")


def test_measured_peak_keeps_the_highest_figure(monkeypatch, tmp_path):
    """A measurement on a busy machine is a lower bound: a slower one never replaces a faster one."""
    import normbench.training.perf as perf

    monkeypatch.setenv("NORMBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(perf, "_MEASURED_HERE", {})
    readings = iter([5e9, 3e9, 7e9])
    monkeypatch.setattr(perf, "_measure_matmul_flops", lambda *a, **k: next(readings))
    cpu = torch.device("cpu")
    # A process measures once, for its first run (a sweep worker's later runs reuse it) ...
    assert [perf.peak_flops(cpu, torch.float32) for _ in range(3)] == [(5e9, "measured matmul")] * 3
    # ... and each new process measures again: the cache keeps the highest figure.
    peaks = []
    for _ in range(2):
        perf._MEASURED_HERE.clear()
        peaks.append(perf.peak_flops(cpu, torch.float32))
    assert peaks == [(5e9, "measured matmul"), (7e9, "measured matmul")]
    assert (tmp_path / "peak_flops.json").exists()


LINUX_RSS = Path("/proc/self/clear_refs").exists()


# Two runs in one fresh process, as the basic launcher runs a sweep. A fresh process, because this
# test's own (pytest's) process holds whatever the tests before it left resident.
TWO_RUNS = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from conftest import train_tiny
out = Path(sys.argv[1])
# The large run's corpus has 4096 tokens: a 128 MB transition matrix (and as much again while it is drawn).
large = train_tiny(out / "large", "data.vocab_size=4096", "train.steps=2", "train.log_every=1",
                   "train.eval_every=2", "train.stats_every=0")
small = train_tiny(out / "small", "train.steps=2", "train.log_every=1", "train.eval_every=2",
                   "train.stats_every=0")
print(json.dumps([large, small]))
"""


@pytest.mark.slow  # two runs in a fresh process, one with a 4096-token corpus
@pytest.mark.skipif(
    not LINUX_RSS, reason="resetting the peak resident set needs Linux's /proc/self/clear_refs"
)
def test_a_small_run_after_a_large_one_reports_its_own_peak(tmp_path):
    """The second of two runs in one process must not inherit the first's peak."""
    done = subprocess.run(
        [sys.executable, "-c", TWO_RUNS, str(tmp_path), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    large, small = json.loads(done.stdout.strip().splitlines()[-1])
    assert large["peak_mem_kind"] == small["peak_mem_kind"] == "cpu_rss"
    for run in (large, small):
        assert run["peak_mem_mb"] >= run["peak_mem_start_mb"] > 0
    assert large["peak_mem_mb"] - large["peak_mem_start_mb"] > 200, large
    # Before the fix the small run reported the process's peak, the large run's.
    assert small["peak_mem_mb"] < large["peak_mem_mb"] - 150, (small, large)


MEMORY_RUNS = """
import sys, tempfile
sys.path.insert(0, {tests!r})
from conftest import compose_cfg
from normbench.training.config import parse_config
from normbench.training.loop import train
common = ["model.n_layer=4", "model.n_head=4", "train.batch_size=64", "train.steps=10", "train.stats_every=0",
          "train.progress=false", "train.eval_batches=2", "train.device=cpu"]
for d in sys.argv[1:]:
    run = parse_config(compose_cfg([f"model.d_model={{d}}", *common]))
    print(train(run, tempfile.mkdtemp())["peak_mem_mb"])
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="the resident high-water mark resets on Linux only"
)
def test_a_runs_peak_memory_is_its_own_whatever_ran_before_it_in_the_process():
    code = MEMORY_RUNS.format(tests=str(Path(__file__).parent))
    after_big = subprocess.run(
        [sys.executable, "-c", code, "512", "64"], capture_output=True, text=True, check=True
    )
    alone = subprocess.run([sys.executable, "-c", code, "64"], capture_output=True, text=True, check=True)
    big, small_after_big = map(float, after_big.stdout.split())
    small_alone = float(alone.stdout)
    assert big > 1.5 * small_alone  # the large run really is larger
    assert small_after_big == pytest.approx(small_alone, rel=0.10)


def test_a_finished_run_is_freed_without_the_garbage_collector(tmp_path, monkeypatch):
    """A run's model and optimizer go as soon as it returns, by reference counting alone: a sweep's
    next run then needs no full collection (free_earlier_runs) to measure its own memory. (The first
    run in a process may leave a cycle: torch's lazy imports keep their frames in one.)"""
    import gc
    import weakref

    import normbench.training.loop as train_module

    overrides = ("train.steps=3", "train.eval_every=3", "train.checkpoint_every=2")
    train_tiny(tmp_path / "first", *overrides)
    built = []
    monkeypatch.setattr(
        train_module, "remember_run", lambda *objects: built.extend(map(weakref.ref, objects))
    )
    gc.collect()
    gc.disable()
    try:
        train_tiny(tmp_path / "second", *overrides)
        alive = [type(ref()).__name__ for ref in built if ref() is not None]
    finally:
        gc.enable()
    assert len(built) == 2 and alive == [], (
        f"still alive after the run returned: {alive} (a reference cycle?)"
    )


def test_tf32_is_set_both_ways_every_run(tmp_path, monkeypatch):
    seen = []
    import normbench.training.loop

    real = normbench.training.loop.build_dataset

    def spy(*args, **kwargs):  # called while the run is set up, after the switches are set
        seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        return real(*args, **kwargs)

    monkeypatch.setattr(normbench.training.loop, "build_dataset", spy)
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        for tf32 in ("true", "false", "true"):
            train_tiny(
                tmp_path / f"{len(seen)}",
                f"train.tf32={tf32}",
                "train.steps=1",
                "train.log_every=1",
                "train.eval_every=1",
            )
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    assert seen == [(True, True), (False, False), (True, True)]


def test_threads_are_set_every_run(tmp_path):
    """train.threads=0 means PyTorch's default, also after a run that asked for another count."""
    import normbench.training.loop

    default = normbench.training.loop.DEFAULT_THREADS
    other = 1 if default != 1 else 2
    try:
        first = train_tiny(
            tmp_path / "a",
            f"train.threads={other}",
            "train.steps=1",
            "train.log_every=1",
            "train.eval_every=1",
        )
        second = train_tiny(
            tmp_path / "b", "train.threads=0", "train.steps=1", "train.log_every=1", "train.eval_every=1"
        )
    finally:
        torch.set_num_threads(default)
    assert first["env"]["threads"] == other
    assert second["env"]["threads"] == default

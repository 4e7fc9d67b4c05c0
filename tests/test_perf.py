"""Step-time percentiles, the summary's performance fields and peak FLOPs, and process-wide state that must
not leak from one run into the next."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import date
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import train_tiny
from rich.console import Console

from normbench.training.display import summary_table
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
    assert out["timed_steps"] == 3  # the steps the figures rest on, warm-up left out


def test_a_run_too_short_for_steady_steps_says_it_timed_none():
    timer = StepTimer(warmup_steps=5)
    timer.times = [1.0, 0.5, 0.4]
    out = timer.summary(tokens_per_step=100)
    assert out["timed_steps"] == 0 and out["tokens_per_s"] == pytest.approx(100 / 0.5)


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
        "timed_steps",
    ):
        assert summary[key] is not None and summary[key] >= 0, key
    assert summary["step_ms_p90"] >= summary["step_ms_p50"]
    # MFU is model FLOPs per second over the given peak.
    assert summary["mfu"] == pytest.approx(
        summary["tokens_per_s"] * summary["flops_per_token"] / 1e12, rel=1e-6
    )
    assert (summary["peak_flops"], summary["peak_flops_source"]) == (1e12, "train.peak_flops")
    # the wall-clock figure: every token trained over the whole run's time, below the steps' own
    tokens = summary["steps"] * 8 * 32  # tiny: batch 8, context 32
    assert summary["wall_tokens_per_s"] == pytest.approx(tokens / summary["wall_s"], rel=1e-6)
    assert summary["wall_tokens_per_s"] < summary["tokens_per_s"]
    closing = Console(width=200, record=True)
    closing.print(summary_table(summary, tmp_path))
    row = next(line for line in closing.export_text().splitlines() if "tokens/s steps / wall clock" in line)
    assert f"{summary['tokens_per_s']:,.0f} / {summary['wall_tokens_per_s']:,.0f}" in row


@pytest.mark.parametrize(
    ("name", "dtype", "tf32", "peak", "source"),
    [
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, True, 989.4e12, "datasheet H100 SXM bf16 dense"),
        ("NVIDIA H100 80GB HBM3", torch.float16, False, 989.4e12, "datasheet H100 SXM fp16 dense"),
        # fp32 matmuls run on tensor cores only with TF32 allowed
        ("NVIDIA H100 80GB HBM3", torch.float32, True, 494.7e12, "datasheet H100 SXM tf32 dense"),
        ("NVIDIA H100 80GB HBM3", torch.float32, False, 66.9e12, "datasheet H100 SXM fp32 dense"),
        ("NVIDIA H100 PCIe", torch.bfloat16, False, 756.5e12, "datasheet H100 PCIe bf16 dense"),
        ("NVIDIA H200", torch.bfloat16, False, 989.4e12, "datasheet H200 SXM bf16 dense"),
        ("NVIDIA A100-SXM4-40GB", torch.float32, True, 156e12, "datasheet A100 SXM tf32 dense"),
        ("NVIDIA L4", torch.bfloat16, False, 121e12, "datasheet L4 bf16 dense"),
        ("NVIDIA GeForce RTX 4090", torch.float32, False, 82.6e12, "datasheet GeForce RTX 4090 fp32 dense"),
        ("Tesla V100-SXM2-32GB", torch.float16, False, 125e12, "datasheet V100 SXM2 fp16 dense"),
    ],
)
def test_datasheet_peaks_by_gpu_name_and_precision(name, dtype, tf32, peak, source):
    from normbench.training.perf import datasheet_peak, matmul_kind

    kind = matmul_kind(torch.device("cuda"), dtype, tf32)
    assert datasheet_peak(name, kind) == (peak, source)


def test_precisions_a_gpu_lacks_and_unknown_gpus_have_no_datasheet_peak():
    from normbench.training.perf import datasheet_peak

    assert datasheet_peak("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 tensor cores: measured
    assert datasheet_peak("NVIDIA H100 NVL", "bf16") is None  # not in the table: measured
    assert datasheet_peak("cpu", "fp32") is None


def test_the_cpu_has_no_tf32():
    from normbench.training.perf import matmul_kind

    assert matmul_kind(torch.device("cpu"), torch.float32, tf32=True) == "fp32"
    assert matmul_kind(torch.device("cpu"), torch.bfloat16, tf32=True) == "bf16"


def test_peak_flops_setting_wins():
    import normbench.training.perf as perf

    assert perf.peak_flops(torch.device("cpu"), torch.bfloat16, setting=5e14) == (5e14, "train.peak_flops")


@pytest.fixture
def peak_cache(monkeypatch, tmp_path):
    """A fresh cache directory and process, and a matmul 'measurement' that hands out ``readings``."""
    import normbench.training.perf as perf

    monkeypatch.setenv("NORMBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(perf, "_MEASURED_HERE", {})
    readings: list[float] = []
    monkeypatch.setattr(perf, "_measure_matmul_flops", lambda *a, **k: readings.pop(0))
    return readings, tmp_path / perf.PEAK_CACHE


def test_measured_peak_is_kept_with_its_date_and_reused(peak_cache):
    import normbench.training.perf as perf

    readings, path = peak_cache
    readings += [5e9]
    cpu = torch.device("cpu")
    today = f"measured {date.today().isoformat()}"
    # Measured once, then reused by this process and by the next one (from the cache file).
    assert [perf.peak_flops(cpu, torch.float32) for _ in range(2)] == [(5e9, today)] * 2
    perf._MEASURED_HERE.clear()
    assert perf.peak_flops(cpu, torch.float32) == (5e9, today)
    (entry,) = json.loads(path.read_text()).values()
    assert entry == {"flops": 5e9, "date": date.today().isoformat(), "torch": torch.__version__}


def test_a_new_measurement_replaces_the_old_figure_even_when_slower(peak_cache):
    import normbench.training.perf as perf

    readings, path = peak_cache
    cpu = torch.device("cpu")
    key = f"cpu|fp32|{torch.get_num_threads()} threads"
    path.write_text(json.dumps({key: {"flops": 9e9, "date": "2020-01-01", "torch": "0.0-other"}}))
    readings += [4e9]
    # A figure from another PyTorch is measured again, and the new figure replaces it (no max).
    assert perf.peak_flops(cpu, torch.float32) == (4e9, f"measured {date.today().isoformat()}")
    assert json.loads(path.read_text())[key]["flops"] == 4e9


def test_measured_peaks_are_kept_per_precision_and_tf32_setting(peak_cache, monkeypatch):
    import normbench.training.perf as perf

    readings, path = peak_cache
    readings += [1e9, 2e9]
    cpu = torch.device("cpu")
    assert perf.peak_flops(cpu, torch.float32)[0] == 1e9
    assert perf.peak_flops(cpu, torch.bfloat16)[0] == 2e9  # its own key: measured, not fp32's figure
    # A GPU's fp32 peak with TF32 on and off are two keys (their rates differ 7-fold on an H100).
    monkeypatch.setattr(perf, "device_name", lambda device: "Some GPU")
    readings += [3e12, 4e13]
    cuda = torch.device("cuda")
    assert perf.measured_peak(cuda, torch.float32, "fp32")[0] == 3e12
    assert perf.measured_peak(cuda, torch.float32, "tf32")[0] == 4e13
    assert set(json.loads(path.read_text())) >= {"Some GPU|fp32", "Some GPU|tf32"}


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
    assert small_after_big == pytest.approx(small_alone, rel=0.15)  # allocator noise: a few tens of MB


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
    assert first["provenance"]["threads"] == other
    assert second["provenance"]["threads"] == default


class FakeDevice:
    """A clock and a device sync, in order: the device still has ``queued`` seconds of work when the
    host reaches the end of a window (a GPU runs what the host queued after the host moved on)."""

    def __init__(self, queued: float):
        self.now, self.queued, self.calls = 0.0, queued, []

    def clock(self) -> float:
        self.calls.append("clock")
        return self.now

    def sync(self) -> None:
        self.calls.append("sync")
        self.now += self.queued
        self.queued = 0.0


def test_a_window_ends_when_the_device_has_run_it():
    device = FakeDevice(queued=0.9)
    timer = StepTimer(warmup_steps=0, sync=device.sync, clock=device.clock)
    for _ in range(3):  # the host queues a step every 10 ms
        device.now += 0.01
        timer.tick()
    device.calls.clear()
    assert timer.end_window(3) == pytest.approx(0.93)
    assert device.calls == ["sync", "clock"]  # the window's end is read after the device is done
    # Each step gets the window's mean: the host's 10 ms per step is not what the device took.
    assert timer.times == pytest.approx([0.31] * 3)
    assert timer.summary(tokens_per_step=100)["tokens_per_s"] == pytest.approx(100 / 0.31)


def test_a_checkpoint_inside_a_window_counts_the_device_wait_but_not_its_own_time():
    device = FakeDevice(queued=0.5)
    timer = StepTimer(warmup_steps=0, sync=device.sync, clock=device.clock)
    device.now += 0.1
    timer.tick()
    timer.settle()  # before the checkpoint: the queued 0.5 s belongs to the step
    device.now += 7.0  # writing the checkpoint
    timer.resume()
    device.now += 0.2
    timer.tick()
    assert timer.end_window(2) == pytest.approx(0.8)

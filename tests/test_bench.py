"""The norm micro-benchmark: well-formed rows, honest timing, clear errors."""

import io
import math
import time

import pandas as pd
import pytest
import torch
from rich.console import Console

from normbench.bench import timing
from normbench.bench.goals import GOALS, LIMIT
from normbench.bench.timing import COLUMNS, goals, run_bench, time_ms
from normbench.core import provenance
from normbench.core.errors import ConfigError
from normbench.model import kernels
from normbench.model.norms import NORMS

NATIVE = {"ln", "rms", "bn", "gn"}


def quiet():
    return Console(file=io.StringIO(), width=120)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "sub" / "bench.csv"
    console = quiet()
    df = run_bench(
        dtypes=["fp32", "bf16"],
        dims=[32, 64],
        tokens=64,
        repeats=3,
        compile=False,
        threads=1,
        out=out,
        console=console,
    )
    return df, out, console.file.getvalue()


def test_columns_and_one_row_per_config(bench):
    df, _, _ = bench
    assert list(df.columns) == COLUMNS
    assert not df.duplicated(["norm", "impl", "dim", "dtype", "device", "pass"]).any()
    expected = sum(2 if n in NATIVE else 1 for n in NORMS) * 2 * 2 * 2  # impls x dims x dtypes x passes
    assert len(df) == expected
    assert set(df["pass"]) == {"fwd", "fwd+bwd"}
    assert set(df.impl) == {"native", "normbench"}  # compile off: no compiled rows
    assert set(df[df.impl == "native"].norm) == NATIVE
    assert (df.tokens == 64).all() and (df.device == "cpu").all()


def test_times_and_ratios(bench):
    df, _, _ = bench
    assert (df.ms > 0).all() and df.ms.map(math.isfinite).all()
    native = df[df.impl == "native"]
    assert (native.ratio_to_native == 1.0).all()
    assert df[~df.norm.isin(NATIVE)].ratio_to_native.isna().all()
    nb = df[(df.impl == "normbench") & df.norm.isin(NATIVE)]
    assert (nb.ratio_to_native > 0).all() and nb.ratio_to_native.map(math.isfinite).all()
    assert df.ratio_to_compiled.isna().all()
    # Every row has LayerNorm's native op, timed in the same rounds, as its yardstick; on ln's own
    # native row that is a second timing of the same op, so noise, not 1 by construction.
    assert (df.ratio_to_ln > 0).all() and df.ratio_to_ln.map(math.isfinite).all()
    assert (df.copy_gb_per_s > 0).all()
    real = df[df.norm != "none"]
    assert (real.gb_per_s > 0).all()
    # fwd moves 2 full tensors, fwd+bwd 4: check the docstring's formula on one row
    row = real.iloc[0]
    factor = 2 if row["pass"] == "fwd" else 4
    bytes_ = factor * row.tokens * row.dim * (4 if row["dtype"] == "fp32" else 2)
    assert row.gb_per_s == pytest.approx(bytes_ / (row.ms * 1e-3) / 1e9)


def test_every_row_says_what_measured_it(bench):
    """The provenance fields of a run's summary, per row: the code, the device by name, the bench's
    threads, the precision and the implementation each row ran."""
    _, out, _ = bench
    back = pd.read_csv(out)
    assert (back.numerics == provenance.NUMERICS).all() and (back.threads == 1).all()
    assert (back.torch == torch.__version__).all() and (back.device_name == provenance.cpu_name()).all()
    assert (back.precision == back.dtype).all() and (back.compile == "off").all()
    assert (back[back.impl == "native"].norm_impl == "eager").all()
    ours = back[back.impl == "normbench"].set_index("norm").norm_impl
    fused = "fused-cpu" if kernels.available() else "eager"
    assert set(ours["rms"]) == set(ours["gn"]) == set(ours["dyt"]) == {fused}
    assert set(ours["ln"]) == set(ours["derf"]) == {"eager"}


def test_csv_written_and_table_shown(bench):
    df, out, text = bench
    assert out.exists() and not list(out.parent.glob("*.tmp"))
    back = pd.read_csv(out)
    assert list(back.columns) == COLUMNS and len(back) == len(df)
    pd.testing.assert_series_equal(back.ms, df.ms, check_exact=False)
    assert "normbench" in text and "rms" in text


class ThriceLayerNorm(torch.nn.Module):
    """LayerNorm's work done three times over: costs about three LayerNorms, by construction."""

    def __init__(self, dim):
        super().__init__()
        self.ln = torch.nn.LayerNorm(dim)

    def forward(self, x):
        return self.ln(self.ln(self.ln(x)))


class FakeClock:
    """A clock that moves only when a timed fn says so: medians exact whatever the machine's load."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def costs(self, seconds):
        def fn():
            self.now += seconds

        return fn


def test_time_ms_gives_each_fns_cost_per_call_by_the_clock_it_is_given():
    clock = FakeClock()
    ms = time_ms(
        {"ln3": clock.costs(3e-4), "ln": clock.costs(1e-4), "clone": clock.costs(5e-5)},
        repeats=5,
        clock=clock,
    )
    assert ms == {"ln3": pytest.approx(0.3), "ln": pytest.approx(0.1), "clone": pytest.approx(0.05)}


def test_ratio_to_ln_and_copy_bandwidth_are_the_timed_medians_ratios(monkeypatch):
    """run_bench's ratio_to_ln and copy_gb_per_s from timings planted here (ln3 three LayerNorms, a
    clone at half a LayerNorm), against the docstring's formulas computed by hand."""
    monkeypatch.setitem(NORMS, "ln3", ThriceLayerNorm)
    planted = {"normbench": 0.3, "ref:ln": 0.1, "ref:copy": 0.05}

    def timed(steps, **_):
        return {(impl, p): planted.get(impl, 0.2) * (2 if p == "fwd+bwd" else 1) for impl, p in steps}

    monkeypatch.setattr(timing, "time_ms", timed)
    tokens, dim = 512, 256
    df = run_bench(dims=[dim], tokens=tokens, norms=["ln3"], repeats=3, compile=False, console=quiet())
    for _, row in df.iterrows():
        assert row.ratio_to_ln == pytest.approx(3.0)  # 0.3 / 0.1, and 0.6 / 0.2 with the backward
        assert row.copy_gb_per_s == pytest.approx(2 * tokens * dim * 4 / 0.05 / 1e6)


def test_timing_of_a_known_sleep():
    # a sleep never ends early; load can only lengthen it, so only the lower bound is the mechanism's
    ms = time_ms(lambda: time.sleep(0.002), repeats=5, warmup=1)
    assert ms >= 1.9


def test_timing_uses_blocks_for_fast_calls():
    calls = []
    ms = time_ms(lambda: calls.append(1), repeats=3)
    assert ms < 0.1 and len(calls) > 100  # many calls per block, not one timer read per call


@pytest.mark.parametrize(
    "kwargs, allowed",
    [
        (dict(dtypes=["fp8"]), "fp32"),
        (dict(norms=["ln", "nope"]), "rms"),
        (dict(device="tpu"), "cpu"),
        (dict(device="banana"), "cpu"),
        (dict(dims=[64, 0]), None),
        (dict(dims=[]), None),
        (dict(tokens=0), None),
        (dict(repeats=0), None),
        (dict(threads=0), None),
        (dict(dims=[6], norms=["gn"]), 3),  # gn's 4 groups don't divide 6
    ],
)
def test_bad_input_raises_config_error(kwargs, allowed):
    with pytest.raises(ConfigError) as e:
        run_bench(**{"dims": [32], "tokens": 8, "compile": False, "console": quiet(), **kwargs})
    if allowed is not None:
        assert allowed in e.value.allowed


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_unavailable():
    with pytest.raises(ConfigError, match="CUDA") as e:
        run_bench(device="cuda", dims=[32], console=quiet())
    assert e.value.allowed == ["cpu"]


def test_cpu_clock_counts_work_not_waiting():
    busy = lambda: sum(range(20_000))
    twice = lambda: sum(range(40_000))
    start = time.perf_counter()
    cpu = time_ms({"busy": busy, "twice": twice}, repeats=5, clock=time.thread_time)
    passed_ms = 1e3 * (time.perf_counter() - start)
    # Never more than the time that passed: three of the five blocks took at least the median each. (A
    # wall time measured apart from these calls can be shorter when the machine's load changes.)
    assert 0 < cpu["busy"] <= passed_ms / 3
    # Twice the work reads about twice the CPU time, however loaded the machine (a wall-clock
    # ratio does not: at load average 22 on 2 vCPUs the busy loop's wall time was 5x its CPU time).
    assert 1.5 < cpu["twice"] / cpu["busy"] < 2.7
    assert time_ms(lambda: time.sleep(0.002), repeats=3, warmup=1, clock=time.thread_time) < 0.5


def test_compile_failure_is_skipped_with_a_note(monkeypatch):
    import normbench.bench.timing as bench

    def broken(*args):
        raise RuntimeError("no C++ compiler found\nlong traceback...")

    monkeypatch.setattr(bench, "_compile", broken)
    console = quiet()
    df = run_bench(dims=[32], tokens=16, norms="dyt", repeats=2, compile=True, console=console)
    assert set(df.impl) == {"normbench"} and df.ratio_to_compiled.isna().all()
    text = console.file.getvalue()
    assert (
        text.count("compiled skipped") == 1
        and "no C++ compiler found" in text
        and "long traceback" not in text
    )


def test_every_norm_of_the_zoo_has_a_goal_derf_held_to_layernorms_op_like_dyt():
    assert set(GOALS) == set(NORMS) - {"none"}  # "none" normalizes nothing: nothing to time
    assert GOALS["derf"] == GOALS["dyt"] == ("ln", LIMIT)
    rows = [
        ("derf", "fp32", 64, "fwd", 1.05),
        ("derf", "fp32", 128, "fwd+bwd", 1.2),
        ("derf", "bf16", 64, "fwd", 1.1),
    ]
    df = pd.DataFrame(
        [
            dict(norm=n, impl="normbench", dtype=t, dim=d, ratio_to_ln=r, **{"pass": p})
            for n, t, d, p, r in rows
        ]
    )
    assert goals(df).to_dict("records") == [
        dict(norm="derf", dtype="fp32", reference="ln", goal=1.1, worst=1.2, at="128 fwd+bwd", met=False),
        dict(norm="derf", dtype="bf16", reference="ln", goal=1.1, worst=1.1, at="64 fwd", met=True),
    ]

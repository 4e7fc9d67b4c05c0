"""The training loop, the run directory contract and z-loss, on tiny models."""

from __future__ import annotations

import collections
import json
import math
import os
import shutil
import subprocess
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from conftest import compose_cfg, read_metrics, skip_unless_ci, stats_step, tiny, train_tiny
from omegaconf import open_dict

import normbench
from normbench.core import provenance
from normbench.core.errors import ConfigError
from normbench.data.corpus import build_dataset
from normbench.model import impls, kernels
from normbench.model.gpt import GPT, qk_norms
from normbench.model.norms import NORMS
from normbench.model.placements import PLACEMENTS
from normbench.training import sinks
from normbench.training.config import group_options, load_group, parse_config
from normbench.training.optim import build_optimizer, lr_factor
from normbench.training.sinks import NoOptions
from normbench.training.summary import LEAK_TOLERANCE


def test_every_group_option_composes_and_validates():
    for group in ("norm", "placement", "model", "data", "train", "logger"):
        for option in group_options(group):
            extra = ["data.path=README.md"] if (group, option) == ("data", "text") else []
            run = parse_config(compose_cfg([f"{group}={option}", *extra]))
            assert run.model.d_model % run.model.n_head == 0


def test_placements_and_norms_have_yaml_files():
    assert group_options("placement") == sorted(PLACEMENTS)
    assert group_options("norm") == sorted(NORMS)


def test_run_directory_contract(tmp_path):
    summary = train_tiny(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} >= {"metrics.jsonl", "summary.json"}
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    for key in (
        "status",
        "final_val_loss",
        "best_val_loss",
        "floor_loss",
        "tokens_per_s",
        "wall_s",
        "steps",
        "params",
        "provenance",
        "causal_leak",
    ):
        assert key in on_disk, key
    assert on_disk["status"] == "completed" and on_disk["steps"] == 20
    assert on_disk["params"] == summary["params"] > 0
    assert set(on_disk["provenance"]) >= {"torch", "python", "device", "device_name", "threads", "commit"}
    assert "env" not in on_disk  # one block says what a run was measured with
    assert not list(tmp_path.glob(".*.tmp")), "atomic write left a temp file"
    records = read_metrics(tmp_path)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in train] == [5, 10, 15, 20]
    assert [r["step"] for r in evals] == [0, 10, 20]
    assert all({"train_loss", "lr", "tokens_per_s"} <= set(r) for r in train)
    assert on_disk["final_val_loss"] == evals[-1]["val_loss"]
    assert on_disk["best_val_loss"] == min(r["val_loss"] for r in evals)


@pytest.mark.slow  # a 60-step training
def test_loss_falls(tmp_path):
    train_tiny(tmp_path, "train.steps=60", "train.lr=1e-2")
    evals = [r["val_loss"] for r in read_metrics(tmp_path) if r["kind"] == "eval"]
    assert evals[0] == pytest.approx(math.log(64), abs=0.3)  # untrained: about uniform
    assert evals[-1] < evals[0] - 0.5


def test_the_step_0_evaluation_records_the_unigram_loss_of_its_validation_targets(tmp_path):
    """What a run that ignores its context ends at: the entropy of the validation targets' token
    frequencies, checked by hand over the very batches the run evaluates on."""
    train_tiny(tmp_path, "train.steps=2")
    first = next(r for r in read_metrics(tmp_path) if r["kind"] == "eval")
    run = parse_config(compose_cfg(tiny()))
    tcfg = run.train
    data = build_dataset(run.data, run.model.block_size, tcfg.eval_batches * tcfg.batch_size)
    counts = collections.Counter(
        int(t) for _, y in data.val_batches(tcfg.eval_batches, tcfg.batch_size) for t in y.flatten()
    )
    total = sum(counts.values())
    by_hand = -sum(c / total * math.log(c / total) for c in counts.values())
    assert first["step"] == 0 and first["unigram_loss"] == pytest.approx(by_hand, rel=1e-9)
    assert first["unigram_loss"] < math.log(64)  # the corpus is not uniform: a unigram model learns


@pytest.mark.slow  # three trainings (the fast tier's test_checkpoint compares seeded runs bit for bit)
def test_same_seed_same_curve_bit_for_bit(tmp_path):
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("tokens_per_s", "step_ms")} for r in rs]
    train_tiny(tmp_path / "a", "model.dropout=0.1", "seed=3")
    train_tiny(tmp_path / "b", "model.dropout=0.1", "seed=3")
    train_tiny(tmp_path / "c", "model.dropout=0.1", "seed=4")
    a, b, c = (strip(read_metrics(tmp_path / n)) for n in "abc")
    assert a == b
    assert a != c


def test_divergence_is_a_result_not_a_crash(tmp_path):
    summary = train_tiny(
        tmp_path,
        "train.lr=50",
        "train.warmup_steps=0",
        "train.grad_clip=0",
        "norm=none",
        "train.steps=200",
        "train.log_every=1",
        "train.diverge_threshold=6.0",
    )
    assert summary["status"] == "diverged"
    assert summary["steps"] < 200 and summary["final_val_loss"] is None
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "diverged"


# The learning rate of update u (1-based) for steps=21, warmup_steps=4, lr=0.01, min_lr=0.001, by hand:
# warm-up lr * u / 4 for u <= 4; then lr at u = 5, and min_lr + (lr - min_lr) (1 + cos(pi p)) / 2 with
# p = (u - 5) / 16, so that the last update (u = 21) is made at min_lr.
LR_TABLE = {
    1: 0.0025,  # the first update
    4: 0.01,  # the end of warm-up
    5: 0.01,  # the cosine starts at lr
    9: 0.001 + 0.009 * (1 + 0.7071067811865476) / 2,  # p = 1/4
    13: 0.0055,  # p = 1/2: half-way between lr and min_lr
    21: 0.001,  # the last update
}


def test_lr_schedule_at_the_updates_training_makes(tmp_path):
    train_tiny(
        tmp_path,
        "train.steps=21",
        "train.lr=0.01",
        "train.min_lr=0.001",
        "train.warmup_steps=4",
        "train.log_every=1",
        "train.eval_every=21",
    )
    logged = {
        r["step"]: r["lr"] for r in read_metrics(tmp_path) if r["kind"] == "train"
    }  # the lr update `step` used
    assert sorted(logged) == list(range(1, 22))
    for update, lr in LR_TABLE.items():
        assert logged[update] == pytest.approx(lr, rel=1e-12), update
    cfg = load_group("train", steps=21, lr=0.01, min_lr=0.001, warmup_steps=4)
    assert all(logged[u] == pytest.approx(0.01 * lr_factor(u - 1, cfg), rel=1e-12) for u in logged)


def test_weight_decay_skips_norms_biases_and_embeddings():
    model = GPT(
        load_group("model", n_layer=2, d_model=16, n_head=2, block_size=8),
        11,
        {"name": "ln"},
        {"name": "pre"},
    )
    opt = build_optimizer(model, load_group("train", weight_decay=0.3), torch.device("cpu"))
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[i] for i in decayed} == {
        f"blocks.{b}.{m}.weight" for b in range(2) for m in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
    }
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


# The fast tier trains every norm in pre and every placement with ln (13 pairs); the other 36 are slow.
@pytest.mark.parametrize(
    "norm, placement",
    [
        pytest.param(norm, placement, marks=() if norm == "ln" or placement == "pre" else pytest.mark.slow)
        for norm in sorted(NORMS)
        for placement in sorted(PLACEMENTS)
    ],
)
def test_every_norm_in_every_placement_trains_and_probes(tmp_path, norm, placement):
    summary = train_tiny(
        tmp_path,
        f"norm={norm}",
        f"placement={placement}",
        "train.steps=6",
        "train.log_every=3",
        "train.eval_every=6",
    )
    assert summary["status"] == "completed"
    assert math.isfinite(summary["final_val_loss"])
    leak = summary["causal_leak"]
    assert leak["eval"] < LEAK_TOLERANCE, "eval mode must be causal for every norm"
    if norm == "bn" and PLACEMENTS[placement].builds_norms:  # nGPT, ReZero: norm= is ignored
        assert leak["train"] > 1e-2 and summary["leaks_future"], "BatchNorm's train-mode leak must show"
    else:
        assert leak["train"] < LEAK_TOLERANCE and not summary["leaks_future"]


@pytest.mark.parametrize(
    "overrides",
    [
        *([f"model.qk_norm={n}", "placement=reordered"] for n in qk_norms()),
        ["model.qk_norm=rms", "norm=bn", "placement=post"],
        ["model.qk_norm=ln", "placement=mixln", "placement.post_fraction=0.5", "model.n_layer=4"],
        ["train.z_loss=1e-4", "placement=lns"],
        ["model.arch=llama", "norm=rms"],
        [
            "model.arch=llama",
            "model.qk_norm=rms",
            "model.attn_softcap=5.0",
            "model.logit_softcap=3.0",
            "placement=reordered",
        ],
        ["model.attn_softcap=5.0", "model.logit_softcap=3.0", "norm=bn", "train.z_loss=1e-4"],
    ],
)
def test_new_options_train_and_eval_mode_is_causal(tmp_path, overrides):
    summary = train_tiny(tmp_path, *overrides, "train.steps=6", "train.log_every=3", "train.eval_every=6")
    assert summary["status"] == "completed" and math.isfinite(summary["final_val_loss"])
    assert summary["causal_leak"]["eval"] < LEAK_TOLERANCE


def test_batchnorm_validation_uses_running_statistics(tmp_path):
    """Val loss is computed in eval mode: the same number the eval-mode model gives by hand."""
    from normbench.training.loop import Run

    run = parse_config(
        compose_cfg(
            [
                "model=tiny",
                "norm=bn",
                "train.device=cpu",
                "data.train_sequences=64",
                "data.val_sequences=64",
                "train.eval_batches=2",
                "train.batch_size=8",
            ]
        )
    )
    state = Run(run, tmp_path)
    for _ in range(3):
        state.train_step()
    bn = state.model.blocks[0].norm_attn.bn
    running = bn.running_mean.clone()
    val = state.evaluate()
    assert torch.equal(bn.running_mean, running), "evaluation must not update running statistics"
    state.model.eval()
    with torch.no_grad():
        by_hand = torch.stack([state.model(x, y)[1] for x, y in state.val]).mean().item()
    assert val == pytest.approx(by_hand, rel=1e-6)


@pytest.mark.slow  # torch.compile
def test_compiled_model_trains_to_the_eager_loss(tmp_path):
    """train.compile=true compiles or fails: a normbench bug in the compiled path fails this test (CI has
    the compiler torch.compile needs on the CPU; elsewhere a machine without one skips)."""
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        skip_unless_ci("no C++ compiler for torch.compile on the CPU")
    compiled = train_tiny(tmp_path / "compiled", "train.compile=true")
    assert compiled["compiled"] and compiled["provenance"]["compile"] == "on"
    eager = train_tiny(tmp_path / "eager")
    assert compiled["status"] == eager["status"] == "completed"
    assert compiled["final_val_loss"] == pytest.approx(eager["final_val_loss"], rel=1e-3)


def test_compile_true_fails_where_compiling_fails_and_auto_falls_back_with_a_message(
    tmp_path, monkeypatch, capsys
):
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(torch, "compile", broken)
    with pytest.raises(ConfigError, match=r"train.compile=true: torch.compile failed here \(RuntimeError"):
        train_tiny(tmp_path / "strict", "train.compile=true")
    summary = train_tiny(tmp_path, "train.compile=auto")
    assert summary["status"] == "completed" and summary["compiled"] is False
    assert "training eagerly" in capsys.readouterr().err
    assert summary["provenance"]["compile"] == "fell back: RuntimeError: no C++ compiler"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True).stdout


def test_the_summary_says_which_code_and_implementation_computed_it(tmp_path):
    """summary.json's provenance block: the code (version, commit, dirty), torch, the device by name,
    threads, precision, each norm's implementation, compile and the numerics version."""
    summary = train_tiny(tmp_path, "norm=rms", "train.threads=1", "train.steps=4")
    block = json.loads((tmp_path / "summary.json").read_text())["provenance"]
    assert block == summary["provenance"]
    assert block["normbench"] == normbench.__version__ and block["torch"] == torch.__version__
    if _git("rev-parse", "HEAD"):
        assert _git("rev-parse", "HEAD").startswith(block["commit"]) and isinstance(block["dirty"], bool)
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    cpu = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
    assert block["device"] == "cpu" and block["device_name"] == (cpu[0] if cpu else block["device_name"])
    assert block["threads"] == 1 and block["precision"] == "fp32" and block["compile"] == "off"
    assert block["norm_impl"] == {"rms": "fused-cpu" if kernels.available() else "eager"}
    assert block["numerics"] == provenance.NUMERICS and provenance.numerics_of(summary) == provenance.NUMERICS


def test_bit_for_bit_under_the_same_implementation_and_threads(tmp_path):
    """Two runs of one config with the same norm implementation and thread count give the same metrics bit
    for bit; norm.impl=eager is another implementation of the same math: close figures, and a provenance
    that tells it apart."""
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("tokens_per_s", "step_ms")} for r in rs]
    args = ("norm=rms", "train.threads=1", "train.steps=6", "train.log_every=1")
    runs = {
        name: train_tiny(tmp_path / name, *args, *extra)
        for name, extra in (("a", ()), ("b", ()), ("eager", ("norm.impl=eager",)))
    }
    a, b = (strip(read_metrics(tmp_path / name)) for name in ("a", "b"))
    assert runs["a"]["provenance"]["norm_impl"] == runs["b"]["provenance"]["norm_impl"]
    assert a == b
    assert runs["eager"]["provenance"]["norm_impl"] == {"rms": "eager"}
    assert runs["eager"]["final_val_loss"] == pytest.approx(runs["a"]["final_val_loss"], rel=1e-4)


def test_norm_impl_other_than_auto_is_its_own_config_and_auto_keeps_stored_identities():
    """auto computes what a config computed before norm.impl existed (the same hash); eager or fused are
    asked for by name, so their speed is never a reused result of the other implementation."""
    hashes = {impl: parse_config(compose_cfg(tiny(f"norm.impl={impl}"))).config_hash for impl in impls.MODES}
    before = compose_cfg(tiny())
    with open_dict(before):
        del before.norm["impl"]
    assert hashes["auto"] == parse_config(before).config_hash
    assert len(set(hashes.values())) == 3


def test_norm_impl_fused_where_a_norm_has_none_is_an_error_before_training(tmp_path):
    with pytest.raises(ConfigError, match="norm.impl=fused: ln cannot run fused on cpu"):
        train_tiny(tmp_path, "norm=ln", "norm.impl=fused")
    assert not (tmp_path / "metrics.jsonl").exists()


def test_normbench_kernels_0_makes_auto_eager_and_says_so_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NORMBENCH_KERNELS", "0")
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setattr(impls, "_said", set())
    summary = train_tiny(tmp_path, "norm=gn", "train.steps=2")
    assert summary["provenance"]["norm_impl"] == {"gn": "eager"}
    lines = [line for line in capsys.readouterr().err.splitlines() if "kernels unavailable" in line]
    assert lines == [
        "normbench: fused CPU norm kernels unavailable (NORMBENCH_KERNELS=0); the norms dyt, gn, rms, "
        "scale run eager PyTorch on the CPU (slower)"
    ]
    with pytest.raises(
        ConfigError, match=r"norm.impl=fused: gn cannot run fused on cpu \(NORMBENCH_KERNELS=0\)"
    ):
        train_tiny(tmp_path / "fused", "norm=gn", "norm.impl=fused")


def _throughput_benchmark():
    """benchmarks/train_throughput.py, which is a script, not part of the package."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks" / "train_throughput.py"
    spec = importlib.util.spec_from_file_location("train_throughput", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_step_runs_the_ops_of_a_bare_loop_and_its_trajectory():
    """The throughput benchmark's premise: same work per step, same weights after it.

    normbench's step may add only the detach of the logged loss and gradient norm and the
    batch's no-op move to its device; an extra op per step (a host sync, a copy) fails here.
    """
    bench = _throughput_benchmark()
    run = parse_config(compose_cfg(tiny("train.stats_every=0")))
    with bench.paired_steps(run) as (steps, models):
        for name in ("bare", "normbench"):
            steps[name]()  # the first step creates AdamW's state
        ops = {name: bench.aten_ops(steps[name], count=3) for name in ("bare", "normbench")}
        weights = {name: list(model.parameters()) for name, model in models.items()}
    assert sum(ops["bare"].values()) > 100
    assert ops["bare"] - ops["normbench"] == {}, "normbench's step skips work the bare loop does"
    assert ops["normbench"] - ops["bare"] == {"aten::detach": 6, "aten::to": 6}
    # Same initial weights, batches, clipping, schedule and optimizer: the same weights after 4 steps.
    for a, b in zip(*weights.values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow  # two 40-step trainings
def test_bf16_trains_end_to_end_close_to_fp32(tmp_path):
    """bf16 autocast on the CPU: a finite loss curve that follows fp32's on the same seed and data."""
    fp32 = train_tiny(tmp_path / "fp32", "train.steps=40", "train.lr=1e-2", "train.eval_every=20", "seed=5")
    bf16 = train_tiny(
        tmp_path / "bf16",
        "train.steps=40",
        "train.lr=1e-2",
        "train.eval_every=20",
        "seed=5",
        "train.precision=bf16",
    )
    assert bf16["status"] == fp32["status"] == "completed"
    curves = {
        name: [r["val_loss"] for r in read_metrics(tmp_path / name) if r["kind"] == "eval"]
        for name in ("fp32", "bf16")
    }
    assert all(math.isfinite(v) for v in curves["bf16"])
    assert curves["bf16"][-1] < curves["bf16"][0] - 0.3  # it learns (4.16 -> 3.66 here)
    # bf16 keeps 8 bits of mantissa: the curves part by thousandths of a nat, not by what training gains.
    for a, b in zip(curves["fp32"], curves["bf16"], strict=True):
        assert b == pytest.approx(a, abs=0.02)  # 0.003 apart here
    assert curves["bf16"] != curves["fp32"], "bf16 must actually compute in bf16"


# ---------------------------------------------------------------- z-loss


def test_z_loss_adds_exactly_its_term(tmp_path):
    coef = 0.05
    record, weights, _, x, y, state = stats_step(tmp_path, f"train.z_loss={coef}")
    with torch.no_grad():
        state.model.load_state_dict(weights)
    state.model.zero_grad(set_to_none=True)
    logits = state.model(x)[0]
    log_z = torch.log(torch.exp(logits.double()).sum(-1))
    ce = (log_z - logits.double().gather(-1, y.unsqueeze(-1)).squeeze(-1)).mean()
    z_term = coef * log_z.pow(2).mean()
    assert float(state.z_term) == pytest.approx(z_term.item(), rel=1e-5)
    (ce + z_term).backward(retain_graph=True)
    with_z = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in state.model.parameters()))
    assert record["grad_norm"] == pytest.approx(with_z, rel=1e-4), "the gradient is that of CE + z-loss"
    state.model.zero_grad(set_to_none=True)
    ce.backward()
    without = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in state.model.parameters()))
    assert abs(with_z - without) > 1e-3 * without, "the z term must change the gradient"


def test_z_loss_is_logged_apart_and_train_loss_stays_cross_entropy(tmp_path):
    train_tiny(tmp_path / "z", "train.z_loss=0.01", "train.log_every=1", "train.steps=2")
    train_tiny(tmp_path / "plain", "train.log_every=1", "train.steps=2")
    z_run = [r for r in read_metrics(tmp_path / "z") if r["kind"] == "train"]
    plain = [r for r in read_metrics(tmp_path / "plain") if r["kind"] == "train"]
    assert all(r["z_loss"] > 0 for r in z_run) and all("z_loss" not in r for r in plain)
    # The first step's loss is taken before any update: the same cross-entropy with and without z-loss.
    assert z_run[0]["train_loss"] == pytest.approx(plain[0]["train_loss"], rel=1e-6)
    # At init the logits are about 0, so Z is about the vocabulary size: z = coef * ln(64)^2.
    assert z_run[0]["z_loss"] == pytest.approx(0.01 * math.log(64) ** 2, rel=0.02)


def test_evaluation_follows_eval_every_whatever_log_every(tmp_path):
    """eval_every=3 with log_every=4 (co-prime): evaluated at 0, 3, 6, 9, 12, the same validation losses as
    a run that logs every step (evaluating reads the model, never trains it)."""
    cadence = ("train.steps=12", "train.eval_every=3", "train.checkpoint_every=0")
    summary = train_tiny(tmp_path / "apart", *cadence, "train.log_every=4")
    train_tiny(tmp_path / "every", *cadence, "train.log_every=1")
    evals = {
        name: [(r["step"], r["val_loss"]) for r in read_metrics(tmp_path / name) if r["kind"] == "eval"]
        for name in ("apart", "every")
    }
    assert [step for step, _ in evals["apart"]] == [0, 3, 6, 9, 12]
    assert evals["apart"] == evals["every"]
    assert summary["best_val_loss"] == min(loss for _, loss in evals["every"])
    train_steps = [r["step"] for r in read_metrics(tmp_path / "apart") if r["kind"] == "train"]
    assert train_steps == [4, 8, 12]  # the log windows keep their own cadence


class BrokenTracker:
    """A tracker whose store goes away: ``fails_at`` (log or finish) raises, as a lost connection would."""

    name, Options, check = "broken", NoOptions, "the broken store"
    fails_at = "finish"
    calls: ClassVar[list[str]] = []

    def __init__(self, run_dir, options, info):
        pass

    def _call(self, method: str) -> None:
        self.calls.append(method)
        if method == self.fails_at:
            raise ConnectionError("store unreachable")

    def log(self, record):
        self._call("log")

    def flush(self):
        self._call("flush")

    def close(self):
        self._call("close")

    def finish(self, summary):
        self._call("finish")

    def abort(self):
        self._call("abort")


@pytest.mark.parametrize("fails_at", ["finish", "log"])
def test_a_failing_tracker_is_one_warning_and_the_run_keeps_its_result(
    tmp_path, monkeypatch, capsys, fails_at
):
    """Registered in sinks.SINKS like any tracker: its failure leaves the run completed, with the summary,
    metrics and files of the same run without it, and says which tracker failed and what to check."""
    monkeypatch.setitem(sinks.SINKS, "broken", (BrokenTracker, (), None))
    monkeypatch.setattr(BrokenTracker, "fails_at", fails_at)
    monkeypatch.setattr(BrokenTracker, "calls", [])
    overrides = ("train.steps=10", "train.save_model=true", "train.checkpoint_every=5")
    plain = train_tiny(tmp_path / "plain", *overrides)
    capsys.readouterr()
    tracked = train_tiny(tmp_path / "tracked", *overrides, "+logger.broken={}")
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "logger=broken failed (ConnectionError: store unreachable)" in warnings[0]
    assert warnings[0].endswith("check the broken store")
    assert BrokenTracker.calls[-2:] == [fails_at, "abort"]  # ended, then left out
    on_disk = json.loads((tmp_path / "tracked" / "summary.json").read_text())
    assert tracked["status"] == on_disk["status"] == "completed" and on_disk["error"] is None
    assert on_disk["final_val_loss"] == plain["final_val_loss"]
    assert read_metrics(tmp_path / "tracked") == [
        {**r, **{k: r2[k] for k in ("tokens_per_s", "step_ms") if k in r}}
        for r, r2 in zip(read_metrics(tmp_path / "plain"), read_metrics(tmp_path / "tracked"), strict=True)
    ]  # every record, the same numbers but the timings
    names = {p.name for p in (tmp_path / "plain").iterdir()}
    assert names == {p.name for p in (tmp_path / "tracked").iterdir()} and "model.pt" in names


def test_steps_the_gradient_scaler_skips_are_no_steps_of_the_lr_schedule(tmp_path):
    """fp16's scaler skips an update whose gradients overflowed: the schedule must not advance then."""
    from normbench.training.loop import Run

    state = Run(parse_config(compose_cfg(tiny("train.warmup_steps=5"))), tmp_path)
    state.scaler = torch.amp.GradScaler("cpu")  # the CPU's scaler does what CUDA's does
    planted = {1, 2, 5}  # the steps whose gradients overflow
    overflow = [False]
    weight = next(state.model.parameters())
    weight.register_hook(lambda grad: grad * math.inf if overflow[0] else grad)
    taken = []
    for step in range(8):
        overflow[0] = step in planted
        before = [p.detach().clone() for p in state.model.parameters()]
        state.train_step()
        taken.append(any(not torch.equal(b, p) for b, p in zip(before, state.model.parameters())))
    assert taken == [step not in planted for step in range(8)]
    assert state.scheduler.last_epoch == 5
    assert state.scheduler.get_last_lr()[0] == pytest.approx(state.tcfg.lr * lr_factor(5, state.tcfg))


def test_the_compile_trial_runs_on_the_batch_the_first_step_trains_on(tmp_path, monkeypatch):
    """Its shapes are training's (this rank's share of the global batch, not a validation batch),
    and the batch stream is left where it was."""
    from normbench.training import loop

    trial = []

    def record(step_model, model, x, y, autocast):
        trial.append((x, y))
        return step_model, None

    monkeypatch.setattr(loop, "compile_model", record)
    cfg = parse_config(compose_cfg(tiny("train.compile=true")))
    state = loop.Run(cfg, tmp_path)
    x, y = state.data.train_batch(cfg.train.batch_size, torch.Generator().manual_seed(cfg.seed))
    assert torch.equal(trial[0][0], x) and torch.equal(trial[0][1], y)
    assert torch.equal(state.train_batch(state.batch_gen)[0], x)  # the first step draws that same batch


# What a fixed configuration computes under this code's NUMERICS: its first three training losses per
# placement (norm=ln, eager, one thread, the tiny corpus of conftest.tiny), to 1e-4.
FIRST_LOSSES = {
    "numerics": 3,
    "deepnorm": [4.182343, 4.151493, 4.135655],
    "hybrid": [4.177251, 4.143025, 4.14103],
    "lns": [4.179797, 4.136832, 4.124158],
    "mixln": [4.179102, 4.135831, 4.123259],
    "ngpt": [4.196224, 4.162149, 4.174835],
    "peri": [4.168266, 4.124576, 4.134057],
    "post": [4.180968, 4.151704, 4.138258],
    "pre": [4.179102, 4.135831, 4.123259],
    "reordered": [4.168206, 4.126244, 4.134083],
    "rezero": [4.159181, 4.158494, 4.158184],
}
# Post-LN's own recipe (BERT's init, a head of its own) made its default a new configuration, with a hash
# of its own: the configuration pinned above is the one stored before, GPT-2's recipe set explicitly.
PINNED_AS = {"post": ["model.init=gpt2", "model.tie_head=true"]}


@pytest.mark.parametrize("placement", sorted(k for k in FIRST_LOSSES if k != "numerics"))
def test_a_change_in_what_a_config_computes_bumps_numerics(tmp_path, placement):
    """A stored result is reused only under the code's numerics (normbench.core.provenance): a change to
    what a config computes (an init, a schedule, a placement's wiring) must bump NUMERICS, and then these
    pinned losses with it."""
    train_tiny(
        tmp_path,
        f"placement={placement}",
        *PINNED_AS.get(placement, []),
        "norm=ln",
        "norm.impl=eager",
        "train.threads=1",
        "train.steps=3",
        "train.log_every=1",
    )
    losses = [r["train_loss"] for r in read_metrics(tmp_path) if r.get("kind") == "train"]
    assert FIRST_LOSSES["numerics"] == provenance.NUMERICS, "NUMERICS changed: pin the new first losses"
    assert losses == pytest.approx(FIRST_LOSSES[placement], abs=1e-4), (
        f"placement={placement} computes other losses than numerics {provenance.NUMERICS} did: "
        "bump NUMERICS in normbench/core/provenance.py (and its table in docs/runs.md), then pin these"
    )

"""The training loop, the model's wiring and the run directory contract, on tiny models."""

from __future__ import annotations

import json
import math

import pytest
import torch

from normbench.config import group_options, parse_config
from normbench.model import GPT, ModelConfig
from normbench.norms import NORMS
from normbench.placements import PLACEMENTS
from normbench.train import LEAK_TOLERANCE, TrainConfig, build_optimizer, lr_factor

from conftest import compose_cfg, read_metrics, tiny, train_tiny


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
    for key in ("status", "final_val_loss", "best_val_loss", "floor_loss", "tokens_per_s", "wall_s", "steps",
                "params", "env", "causal_leak"):
        assert key in on_disk, key
    assert on_disk["status"] == "completed" and on_disk["steps"] == 20
    assert on_disk["params"] == summary["params"] > 0
    assert set(on_disk["env"]) >= {"torch", "device", "threads", "python", "git_commit"}
    assert not list(tmp_path.glob(".*.tmp")), "atomic write left a temp file"
    records = read_metrics(tmp_path)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in train] == [5, 10, 15, 20]
    assert [r["step"] for r in evals] == [0, 10, 20]
    assert all({"train_loss", "lr", "tokens_per_s"} <= set(r) for r in train)
    assert on_disk["final_val_loss"] == evals[-1]["val_loss"]
    assert on_disk["best_val_loss"] == min(r["val_loss"] for r in evals)


def test_loss_falls(tmp_path):
    train_tiny(tmp_path, "train.steps=60", "train.lr=1e-2")
    evals = [r["val_loss"] for r in read_metrics(tmp_path) if r["kind"] == "eval"]
    assert evals[0] == pytest.approx(math.log(64), abs=0.3)  # untrained: about uniform
    assert evals[-1] < evals[0] - 0.5


def test_same_seed_same_curve_bit_for_bit(tmp_path):
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("tokens_per_s", "step_ms")} for r in rs]  # noqa: E731
    train_tiny(tmp_path / "a", "model.dropout=0.1", "seed=3")
    train_tiny(tmp_path / "b", "model.dropout=0.1", "seed=3")
    train_tiny(tmp_path / "c", "model.dropout=0.1", "seed=4")
    a, b, c = (strip(read_metrics(tmp_path / n)) for n in "abc")
    assert a == b
    assert a != c


def test_divergence_is_a_result_not_a_crash(tmp_path):
    summary = train_tiny(tmp_path, "train.lr=50", "train.warmup_steps=0", "train.grad_clip=0", "norm=none",
                         "train.steps=200", "train.log_every=1", "train.diverge_threshold=6.0")
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
    train_tiny(tmp_path, "train.steps=21", "train.lr=0.01", "train.min_lr=0.001", "train.warmup_steps=4",
               "train.log_every=1", "train.eval_every=21")
    logged = {r["step"]: r["lr"] for r in read_metrics(tmp_path) if r["kind"] == "train"}  # the lr update `step` used
    assert sorted(logged) == list(range(1, 22))
    for update, lr in LR_TABLE.items():
        assert logged[update] == pytest.approx(lr, rel=1e-12), update
    cfg = TrainConfig(steps=21, lr=0.01, min_lr=0.001, warmup_steps=4)
    assert all(logged[u] == pytest.approx(0.01 * lr_factor(u - 1, cfg), rel=1e-12) for u in logged)


def test_weight_decay_skips_norms_biases_and_embeddings():
    model = GPT(ModelConfig(n_layer=2, d_model=16, n_head=2, block_size=8), 11, {"name": "ln"}, {"name": "pre"})
    opt = build_optimizer(model, TrainConfig(weight_decay=0.3), torch.device("cpu"))
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[i] for i in decayed} == {
        f"blocks.{b}.{m}.weight" for b in range(2) for m in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
    }
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


def test_gpt2_init_scales_residual_projections():
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=8, d_model=256, n_head=4, block_size=8), 50, {"name": "ln"}, {"name": "pre"})
    assert model.blocks[0].mlp.fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks[0].mlp.proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert model.head.weight is model.tok_emb.weight


def test_deepnorm_alpha_and_beta_init():
    torch.manual_seed(0)
    n_layer, d = 6, 256
    model = GPT(ModelConfig(n_layer=n_layer, d_model=d, n_head=4, block_size=8), 50, {"name": "ln"}, {"name": "deepnorm", "final_norm": False})
    block = model.blocks[0]
    assert block.alpha == pytest.approx((2 * n_layer) ** 0.25)
    beta = (8 * n_layer) ** -0.25
    xavier = lambda fan_in, fan_out, gain: gain * math.sqrt(2.0 / (fan_in + fan_out))  # noqa: E731
    q, k, v = block.attn.qkv.weight.split(d)
    assert q.std().item() == pytest.approx(xavier(d, d, 1.0), rel=0.05)
    assert v.std().item() == pytest.approx(xavier(d, d, beta), rel=0.05)
    assert block.mlp.fc.weight.std().item() == pytest.approx(xavier(d, 4 * d, beta), rel=0.05)
    assert isinstance(model.norm_final, torch.nn.Identity)


def test_final_norm_can_be_turned_off(tmp_path):
    on = GPT(ModelConfig(), 16, {"name": "rms"}, {"name": "pre", "final_norm": True})
    off = GPT(ModelConfig(), 16, {"name": "rms"}, {"name": "pre", "final_norm": False})
    assert on.num_params() - off.num_params() == ModelConfig().d_model


def test_post_placement_normalizes_the_residual_stream():
    """Post-LN: every block's output is a norm's output; Pre-LN's stream is left alone."""
    torch.manual_seed(0)
    idx = torch.randint(16, (2, 8))
    for placement, normalized in (("post", True), ("pre", False)):
        model = GPT(ModelConfig(n_layer=2, d_model=32, n_head=2, block_size=8), 16, {"name": "ln", "bias": False},
                    {"name": placement, "final_norm": False})
        outs = []
        model.blocks[-1].register_forward_hook(lambda m, i, o: outs.append(o))
        model(idx)
        per_token = outs[0].std(-1, unbiased=False)
        assert torch.allclose(per_token, torch.ones_like(per_token), atol=1e-3) == normalized


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize("norm", sorted(NORMS))
def test_every_norm_in_every_placement_trains_and_probes(tmp_path, norm, placement):
    summary = train_tiny(tmp_path, f"norm={norm}", f"placement={placement}", "train.steps=6", "train.log_every=3",
                         "train.eval_every=6")
    assert summary["status"] == "completed"
    assert math.isfinite(summary["final_val_loss"])
    leak = summary["causal_leak"]
    assert leak["eval"] < LEAK_TOLERANCE, "eval mode must be causal for every norm"
    if norm == "bn":
        assert leak["train"] > 1e-2 and summary["leaks_future"], "BatchNorm's train-mode leak must show"
    else:
        assert leak["train"] < LEAK_TOLERANCE and not summary["leaks_future"]


def test_batchnorm_validation_uses_running_statistics(tmp_path):
    """Val loss is computed in eval mode: the same number the eval-mode model gives by hand."""
    from normbench.train import Run

    run = parse_config(compose_cfg(["model=tiny", "norm=bn", "train.device=cpu", "data.train_sequences=64",
                                    "data.val_sequences=64", "train.eval_batches=2", "train.batch_size=8"]))
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


def test_compiled_model_trains_to_the_eager_loss(tmp_path):
    compiled = train_tiny(tmp_path / "compiled", "train.compile=true")
    if not compiled["compiled"]:
        pytest.skip("torch.compile is not usable on this machine (the run fell back to eager)")
    eager = train_tiny(tmp_path / "eager")
    assert compiled["status"] == eager["status"] == "completed"
    assert compiled["final_val_loss"] == pytest.approx(eager["final_val_loss"], rel=1e-3)


def test_compile_falls_back_to_eager_with_a_message(tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(torch, "compile", broken)
    summary = train_tiny(tmp_path, "train.compile=true")
    assert summary["status"] == "completed" and summary["compiled"] is False
    assert "training eagerly" in capsys.readouterr().err


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


def test_bf16_trains_end_to_end_close_to_fp32(tmp_path):
    """bf16 autocast on the CPU: a finite loss curve that follows fp32's on the same seed and data."""
    fp32 = train_tiny(tmp_path / "fp32", "train.steps=40", "train.lr=1e-2", "train.eval_every=20", "seed=5")
    bf16 = train_tiny(tmp_path / "bf16", "train.steps=40", "train.lr=1e-2", "train.eval_every=20", "seed=5",
                      "train.precision=bf16")
    assert bf16["status"] == fp32["status"] == "completed"
    curves = {name: [r["val_loss"] for r in read_metrics(tmp_path / name) if r["kind"] == "eval"] for name in ("fp32", "bf16")}
    assert all(math.isfinite(v) for v in curves["bf16"])
    assert curves["bf16"][-1] < curves["bf16"][0] - 0.3  # it learns (4.16 -> 3.66 here)
    # bf16 keeps 8 bits of mantissa: the curves part by thousandths of a nat, not by what training gains.
    for a, b in zip(curves["fp32"], curves["bf16"], strict=True):
        assert b == pytest.approx(a, abs=0.02)  # 0.003 apart here
    assert curves["bf16"] != curves["fp32"], "bf16 must actually compute in bf16"

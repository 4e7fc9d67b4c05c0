"""Training diagnostics: the step-0 record, per-layer norms and the attention and output logits against a
direct computation, no side effects."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import compose_cfg, read_metrics, stats_step, tiny, train_tiny

from normbench.core.fileio import leaves
from normbench.training import loop as loop_module
from normbench.training import summary as summary_module
from normbench.training.config import parse_config
from normbench.training.diagnostics import PARTS, LayerStats, layer_skip_losses
from normbench.training.loop import Run
from normbench.training.summary import skipped_layers


def stats_records(run_dir):
    return [r for r in read_metrics(run_dir) if r["kind"] == "stats"]


def test_step_zero_record_is_finite_for_every_block(tmp_path):
    train_tiny(tmp_path, "model.n_layer=3", "train.stats_every=7")
    records = stats_records(tmp_path)
    assert [r["step"] for r in records] == [0, 7, 14]
    first = records[0]
    assert len(first["layers"]) == 3
    for layer in first["layers"]:
        for kind in ("grad_norm", "weight_norm", "update_ratio"):
            assert set(layer[kind]) == {*PARTS, "norm"}
            assert all(math.isfinite(v) and v >= 0 for v in layer[kind].values())
        assert math.isfinite(layer["resid_rms"]) and layer["resid_rms"] > 0
        assert set(layer["gain"]) == {"norm_attn", "norm_mlp"}
    assert first["embedding_tok"]["grad_norm"] > 0 and "gain" in first["final_norm"]
    assert isinstance(first["clipped"], bool)


def test_per_layer_norms_match_a_direct_computation(tmp_path):
    """Rebuild the same model and first batch by hand; every step-0 number must agree."""
    overrides = ["train.stats_every=5", "train.grad_clip=0", "model.n_layer=2"]
    train_tiny(tmp_path / "run", *overrides)
    record = stats_records(tmp_path / "run")[0]

    state = Run(parse_config(compose_cfg(tiny(*overrides))), tmp_path / "by-hand")
    model = state.model
    x, y = state.data.train_batch(state.tcfg.batch_size, state.batch_gen)
    resid = []
    hooks = [b.register_forward_hook(lambda m, i, o: resid.append(o.detach())) for b in model.blocks]
    model(x, y)[1].backward()
    for h in hooks:
        h.remove()
    weights_before = {n: p.detach().clone() for n, p in model.named_parameters()}
    state.optimizer.step()

    def norm(tensors):
        return math.sqrt(sum(float((t.double() ** 2).sum()) for t in tensors))

    for i, block in enumerate(model.blocks):
        layer = record["layers"][i]
        for key, path in PARTS.items():
            module = block.get_submodule(path)
            names = [f"blocks.{i}.{path}.{n}" for n, _ in module.named_parameters()]
            assert layer["grad_norm"][key] == pytest.approx(
                norm([p.grad for p in module.parameters()]), rel=1e-4
            )
            assert layer["weight_norm"][key] == pytest.approx(
                norm([weights_before[n] for n in names]), rel=1e-4
            )
            update = norm([dict(model.named_parameters())[n].detach() - weights_before[n] for n in names])
            assert layer["update_ratio"][key] == pytest.approx(
                update / norm([weights_before[n] for n in names]), rel=1e-3
            )
        norm_grads = [p.grad for n in ("norm_attn", "norm_mlp") for p in getattr(block, n).parameters()]
        assert layer["grad_norm"]["norm"] == pytest.approx(norm(norm_grads), rel=1e-4)
        assert layer["resid_rms"] == pytest.approx(float(resid[i].pow(2).mean().sqrt()), rel=1e-5)
        # the variance over each token's channels, averaged over the tokens (Sun et al. 2025's profile)
        assert layer["resid_var"] == pytest.approx(float(resid[i].var(-1, unbiased=False).mean()), rel=1e-5)
    total = norm([p.grad for p in model.parameters()])
    assert record["grad_norm"] == pytest.approx(total, rel=1e-4)


def test_statistics_off_removes_them(tmp_path):
    train_tiny(tmp_path, "train.stats_every=0")
    assert stats_records(tmp_path) == []


def test_statistics_hook_the_blocks_for_their_own_step_only(tmp_path):
    """Between statistics steps the blocks run hook-free: no per-step cost that grows with depth."""
    state = Run(parse_config(compose_cfg(tiny("model.n_layer=3"))), tmp_path)
    stats = LayerStats(state.model)
    hooked = lambda: sum(len(b._forward_hooks) for b in state.model.blocks)
    assert hooked() == 0
    state.train_step(stats)
    assert hooked() == 0
    recorded = [r.item() for r in stats._resid]
    state.train_step(None)
    assert [r.item() for r in stats._resid] == recorded, "a plain step must not touch the statistics"
    assert stats.record(0, torch.tensor(1.0), 1.0)["layers"][2]["resid_rms"] == pytest.approx(recorded[2])


def test_statistics_do_not_change_training(tmp_path):
    train_tiny(tmp_path / "on", "train.stats_every=1", "norm=bn", "seed=2")
    train_tiny(tmp_path / "off", "train.stats_every=0", "norm=bn", "seed=2")
    curve = lambda d: [
        (r["step"], r.get("train_loss"), r.get("val_loss")) for r in read_metrics(d) if r["kind"] != "stats"
    ]
    assert curve(tmp_path / "on") == curve(tmp_path / "off")


def test_clipping_is_recorded(tmp_path):
    summary = train_tiny(tmp_path, "train.grad_clip=0.05", "train.stats_every=5")
    assert summary["clip_fraction"] == 1.0
    assert summary["max_grad_norm"] > 0.05
    assert all(r["clipped"] for r in stats_records(tmp_path))


def test_tensorboard_mirror_matches_the_jsonl(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train_tiny(tmp_path, "logger=tensorboard", "train.stats_every=10")
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {
        "train_loss",
        "val_loss",
        "lr",
        "tokens_per_s",
        "grad_norm",
        "layers.0.grad_norm.mlp_out",
        "layers.1.resid_rms",
    } <= tags
    jsonl = {r["step"]: r["train_loss"] for r in read_metrics(tmp_path) if r["kind"] == "train"}
    board = {e.step: e.value for e in events.Scalars("train_loss")}
    assert board.keys() == jsonl.keys()
    assert all(board[s] == pytest.approx(jsonl[s], rel=1e-6) for s in jsonl)


# ---------------------------------------------------------------- logit statistics


@pytest.mark.parametrize("qk_norm", ["none", "rms"])
def test_attention_logit_statistics_match_a_hand_computation(tmp_path, qk_norm):
    record, weights, attn_inputs, _, _, state = stats_step(tmp_path, f"model.qk_norm={qk_norm}")
    n_head, d = state.cfg.model.n_head, state.cfg.model.d_model
    hd = d // n_head
    for i, x in enumerate(attn_inputs):
        prefix = f"blocks.{i}.attn."
        qkv = x @ weights[prefix + "qkv.weight"].T + weights[prefix + "qkv.bias"]
        q, k, v = (t.reshape(*x.shape[:2], n_head, hd).transpose(1, 2) for t in qkv.split(d, -1))
        if qk_norm == "rms":
            q = q / q.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * weights[prefix + "q_norm.weight"]
            k = k / k.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * weights[prefix + "k_norm.weight"]
        T = x.shape[1]
        logits = torch.einsum("bhid,bhjd->bhij", q.double(), k.double()) / math.sqrt(hd)
        allowed = torch.tensor([[j <= t for j in range(T)] for t in range(T)])
        assert record["layers"][i]["max_attn_logit"] == pytest.approx(
            float(logits[..., allowed].max()), rel=1e-5
        )
        p = logits.masked_fill(~allowed, -math.inf).softmax(-1)
        entropy = -(p * p.clamp_min(1e-300).log()).sum(-1).mean()
        assert record["layers"][i]["attn_entropy"] == pytest.approx(float(entropy), rel=1e-5)
        # These are the logits SDPA softmaxes: the same weights on v give the same output.
        sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert torch.allclose(p.float() @ v, sdpa, atol=1e-5)
    assert record["max_attn_logit"] == max(layer["max_attn_logit"] for layer in record["layers"])


def test_output_logit_statistics_match_a_hand_computation(tmp_path):
    record, weights, _, x, _, state = stats_step(tmp_path)
    with torch.no_grad():
        state.model.load_state_dict(weights)  # the weights the statistics step saw
        logits = state.model(x)[0].double()
    log_z = torch.log(torch.exp(logits).sum(-1))
    assert record["mean_log_z"] == pytest.approx(float(log_z.mean()), rel=1e-5)
    assert record["max_log_z"] == pytest.approx(float(log_z.max()), rel=1e-5)
    assert record["max_output_logit"] == pytest.approx(float(logits.max()), rel=1e-5)


def test_logit_diagnostics_in_metrics_and_summary(tmp_path):
    summary = train_tiny(tmp_path, "train.stats_every=5", "train.lr=3e-2")
    records = [r for r in read_metrics(tmp_path) if r["kind"] == "stats"]
    assert [r["step"] for r in records] == [0, 5, 10, 15]
    for r in records:
        assert math.isfinite(r["max_attn_logit"]) and math.isfinite(r["max_log_z"])
        assert r["max_log_z"] >= r["mean_log_z"]
        assert all(0 <= layer["attn_entropy"] <= math.log(32) for layer in r["layers"])
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["max_attn_logit"] == summary["max_attn_logit"] == max(r["max_attn_logit"] for r in records)
    assert on_disk["max_log_z"] == max(r["max_log_z"] for r in records)


def test_logit_diagnostics_off_with_the_statistics(tmp_path):
    summary = train_tiny(tmp_path, "train.stats_every=0")
    assert summary["max_attn_logit"] is None and summary["max_log_z"] is None


@pytest.mark.parametrize("norm", ["dyt", "derf"])
def test_saturation_of_point_wise_norms_matches_a_direct_count(tmp_path, norm):
    """The fraction of each point-wise norm's inputs with |alpha x| (Derf: |alpha x + s|) > 2, per layer."""
    from normbench.training.diagnostics import SATURATION

    overrides = [f"norm={norm}", "norm.alpha_init=60.0", "model.n_layer=2"]
    cfg = parse_config(compose_cfg(tiny("train.grad_clip=0", *overrides)))
    state = Run(cfg, tmp_path / "run")
    stats = LayerStats(state.model)
    inputs = {}
    norms = {
        f"{i}.{n}": m
        for i, b in enumerate(state.model.blocks)
        for n, m in b.named_children()
        if n.startswith("norm")
    }
    norms["final_norm"] = state.model.norm_final
    with torch.no_grad():  # a shift away from 0, so Derf's s is in the count
        for m in norms.values():
            if norm == "derf":
                m.shift.fill_(0.5)

    def keep(key):
        def store(module, args, output):
            inputs[key] = (
                args[0].detach(),
                module.alpha.item(),
                module.shift.item() if norm == "derf" else 0.0,
            )

        return store

    hooks = [m.register_forward_hook(keep(key)) for key, m in norms.items()]
    _, grad_norm = state.train_step(stats)
    for h in hooks:
        h.remove()
    record = stats.record(0, grad_norm, 0.0)

    def by_hand(key):
        x, alpha, shift = inputs[key]
        return float(((alpha * x + shift).abs() > SATURATION).double().mean())

    for i, layer in enumerate(record["layers"]):
        assert set(layer["saturation"]) == {"norm_attn", "norm_mlp"}
        for name, fraction in layer["saturation"].items():
            assert fraction == pytest.approx(by_hand(f"{i}.{name}"), abs=1e-6)
            assert 0.0 < fraction < 1.0, (i, name)  # alpha 60 on inputs of std ~0.03: some, not all
    assert record["final_norm"]["saturation"] == pytest.approx(by_hand("final_norm"), abs=1e-6)


def test_norms_with_statistics_have_no_saturation(tmp_path):
    record = stats_step(tmp_path, "norm=ln")[0]
    assert (
        all("saturation" not in layer for layer in record["layers"])
        and "saturation" not in record["final_norm"]
    )


def test_layer_skip_losses_match_the_model_run_by_hand_without_each_block(tmp_path):
    state = Run(parse_config(compose_cfg(tiny("model.n_layer=3"))), tmp_path / "run")
    model = state.model.eval()
    x, y = state.val[0]

    def by_hand(skipped: int) -> float:
        h = model.tok_emb(x) + model.pos_emb(torch.arange(x.shape[1]))
        for i, block in enumerate(model.blocks):
            h = h if i == skipped else block(h)
        logits = model.head(model.norm_final(h))
        return float(F.cross_entropy(logits.flatten(0, 1), y.flatten()))

    with torch.no_grad():
        losses = layer_skip_losses(model, lambda: float(model(x, y)[1]), [0, 2])
        assert losses == pytest.approx({0: by_hand(0), 2: by_hand(2)}, rel=1e-6)
        assert float(model(x, y)[1]) == pytest.approx(by_hand(-1), rel=1e-6)  # the hooks are gone


def test_a_run_with_statistics_records_its_layer_skip_losses(tmp_path):
    summary = train_tiny(tmp_path / "on", "model.n_layer=2", "train.stats_every=5")
    assert len(summary["layer_skip_loss"]) == 2 and all(math.isfinite(v) for v in summary["layer_skip_loss"])
    assert (
        json.loads((tmp_path / "on" / "summary.json").read_text())["layer_skip_loss"]
        == summary["layer_skip_loss"]
    )
    assert train_tiny(tmp_path / "off", "train.stats_every=0")["layer_skip_loss"] is None


def test_end_checks_auto_evaluates_the_layers_that_fit_its_budget_spread_over_the_depth(monkeypatch):
    monkeypatch.setattr(summary_module, "END_CHECKS_FREE_S", 0.0)
    loop = SimpleNamespace(
        state=SimpleNamespace(model=SimpleNamespace(blocks=[None] * 12)),
        tcfg=SimpleNamespace(end_checks="auto"),
        phases=SimpleNamespace(seconds={"eval": 4.0}),  # 1 s per eval
        val_losses=[3.0] * 4,
        wall_s=lambda: 100.0,  # 3% of it: 3 evals
    )
    assert skipped_layers(loop) == [0, 6, 11]
    loop.wall_s = lambda: 1000.0
    assert skipped_layers(loop) == list(range(12))
    loop.wall_s = lambda: 20.0
    assert skipped_layers(loop) == []
    loop.tcfg.end_checks = True
    assert skipped_layers(loop) == list(range(12))
    loop.tcfg.end_checks = False
    assert skipped_layers(loop) == []


def test_end_checks_off_runs_neither_the_probe_nor_the_layer_evals_and_the_summary_says_so(tmp_path):
    out = train_tiny(tmp_path, "train.stats_every=5", "train.end_checks=false")
    assert out["causal_leak"] == {"train": None, "eval": None} and out["layer_skip_loss"] is None
    assert out["end_checks"] == {"setting": False, "probe": False, "skipped_layers": []}


def test_ln_scaling_keeps_the_norms_gains_in_the_statistics(tmp_path):
    train_tiny(tmp_path, "model.n_layer=2", "model.ln_scaling=true", "train.stats_every=5")
    first = stats_records(tmp_path)[0]
    assert all(set(layer["gain"]) == {"norm_attn", "norm_mlp"} for layer in first["layers"])
    assert all(layer["grad_norm"]["norm"] > 0 for layer in first["layers"])


@pytest.mark.slow  # torch.compile: inductor builds its C++ kernels
def test_a_compiled_run_records_the_statistics_an_eager_run_records(tmp_path):
    """train.compile=true: every statistic of every statistics step, the summary's peaks and the layer-skip
    losses, as the same run trained eagerly gives them (float noise apart: the steps between are compiled)."""
    # every end-of-run check in both (auto sizes them to the wall clock, which a busy machine stretches)
    run = (
        "model=micro",
        "train.steps=6",
        "train.stats_every=5",
        "train.log_every=3",
        "train.eval_every=6",
        "train.end_checks=true",
    )
    compiled = train_tiny(tmp_path / "compiled", *run, "train.compile=true")
    if not compiled["compiled"]:
        pytest.skip("torch.compile is not usable on this machine (the run fell back to eager)")
    eager = train_tiny(tmp_path / "eager", *run)
    got, want = stats_records(tmp_path / "compiled"), stats_records(tmp_path / "eager")
    assert [r["step"] for r in got] == [r["step"] for r in want] == [0, 5]
    for record, reference in zip(got, want, strict=True):
        record, reference = leaves(record), leaves(reference)
        assert record.keys() == reference.keys()
        for key, value in reference.items():
            assert value is not None, key  # every statistic measured
            number = isinstance(value, float)
            assert record[key] == (pytest.approx(value, rel=1e-4) if number else value), key
    for key in ("max_attn_logit", "max_log_z", "layer_skip_loss"):
        assert eager[key] is not None and compiled[key] == pytest.approx(eager[key], rel=1e-4), key


def held_for_backward(state: Run, stats: LayerStats | None) -> tuple[int, int]:
    """(how many tensors one training step keeps for its backward, their bytes)."""
    sizes = []

    def pack(tensor):
        sizes.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        state.train_step(stats)
    return len(sizes), sum(sizes)


@pytest.mark.slow  # torch.compile: inductor builds its C++ kernels
def test_a_compiled_runs_statistics_step_trains_compiled_holding_no_more_than_its_other_steps(
    tmp_path, monkeypatch
):
    """A batch that trains compiled must not fail at the first statistics step: that step trains through
    the compiled graph (an eager one keeps more activations), and the trial compile ran the micro-batch
    every forward runs, not the whole batch."""
    trials = []
    compile_model = loop_module.compile_model
    monkeypatch.setattr(
        loop_module, "compile_model", lambda *args: trials.append(args[2].shape) or compile_model(*args)
    )
    shape = ("model=micro", "train.micro_batch_size=4")
    state = Run(parse_config(compose_cfg(tiny(*shape, "train.compile=true"))), tmp_path / "run")
    if not state.compiled:
        pytest.skip("torch.compile is not usable on this machine")
    assert [batch[0] for batch in trials] == [4]
    stats = LayerStats(state.model)
    plain, statistics = held_for_backward(state, None), held_for_backward(state, stats)
    eager = Run(parse_config(compose_cfg(tiny(*shape))), tmp_path / "eager")
    assert held_for_backward(eager, None) != plain  # eager keeps other tensors: the count tells them apart
    assert statistics == plain
    assert stats.record(1, torch.tensor(1.0), 0.0)["layers"][0]["resid_rms"] > 0  # the hooks still read


def test_a_gradient_spike_is_measured_against_the_runs_own_running_median():
    """Two runs whose norms differ by 100x in scale but spike alike read the same spike: the largest
    ratio of a step to the median of the 20 steps before it (hand-computed: 5 / 1, then 5 / 1.0)."""
    from normbench.training.diagnostics import grad_spike

    quiet = [1.0, 1.2, 0.8] * 10  # median of any 20 consecutive: 1.0
    spiky = [*quiet[:25], 5.0, *quiet[25:]]
    assert grad_spike(spiky) == pytest.approx(5.0)
    assert grad_spike([100 * g for g in spiky]) == pytest.approx(5.0)
    assert grad_spike(quiet) == pytest.approx(1.2)
    assert grad_spike(quiet[:20]) is None  # no step after a full window
    assert grad_spike([*spiky, float("nan")]) == pytest.approx(5.0)  # non-finite steps are left out

"""QK-norm, z-loss, the logit diagnostics and the placements of recent models (issue 14)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from normbench.cli import app
from normbench.config import parse_config
from normbench.diagnostics import LayerStats, attention_logits
from normbench.model import GPT, ModelConfig, qk_norms
from normbench.placements import PLACEMENTS
from normbench.train import LEAK_TOLERANCE, Run

from conftest import compose_cfg, read_metrics, tiny, train_tiny

CFG = ModelConfig(n_layer=4, n_head=2, d_model=32, block_size=16)


def build(placement: str, norm: str = "ln", qk_norm: str = "none", **options) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(**{**CFG.__dict__, "qk_norm": qk_norm})
    return GPT(cfg, 16, {"name": norm}, {"name": placement, "final_norm": True, **options}).eval()


def randomize_norms(model: torch.nn.Module) -> None:
    """Gains and biases away from their 1/0 init, so a wrong wiring cannot hide behind them."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)


# ---------------------------------------------------------------- QK-norm


def test_qk_norm_choices_are_the_per_vector_norms():
    assert qk_norms() == ["gn", "ln", "rms", "scale"]


@pytest.mark.parametrize("qk_norm", ["rms", "ln"])
def test_qk_norm_normalizes_each_head_over_head_dim(qk_norm):
    """Per head and token, q and k divided by their gain have RMS 1 (and mean 0 for LayerNorm)."""
    model = build("pre", qk_norm=qk_norm)
    randomize_norms(model)
    attn = model.blocks[1].attn
    head_dim = CFG.d_model // CFG.n_head
    assert attn.q_norm.weight.shape == (head_dim,), "one gain vector shared by all heads"
    assert getattr(attn.q_norm, "bias", None) is None, "QK-norm has no bias"
    x = torch.randn(3, 8, CFG.d_model) * 5
    q, k, _ = attn.heads(x)
    for t, norm in ((q, attn.q_norm), (k, attn.k_norm)):
        unscaled = t / norm.weight
        assert torch.allclose(unscaled.pow(2).mean(-1) if qk_norm == "rms" else unscaled.var(-1, unbiased=False),
                              torch.ones(3, CFG.n_head, 8), atol=1e-3)
        if qk_norm == "ln":
            assert torch.allclose(unscaled.mean(-1), torch.zeros(3, CFG.n_head, 8), atol=1e-4)


@pytest.mark.parametrize("qk_norm", ["rms", "ln"])
def test_qk_norm_bounds_the_attention_logit(qk_norm):
    """|q·k| / sqrt(d) <= ||q|| ||k|| / sqrt(d) <= sqrt(d) max|g_q| max|g_k|, however large the weights."""
    head_dim = CFG.d_model // CFG.n_head
    x = torch.randn(2, 16, CFG.d_model)
    largest = {}
    for which in ("none", qk_norm):
        model = build("pre", qk_norm=which)
        randomize_norms(model)
        attn = model.blocks[0].attn
        with torch.no_grad():
            attn.qkv.weight.mul_(100)
            q, k, _ = attn.heads(x)
        largest[which] = float(attention_logits(q, k).max())
        if which != "none":
            bound = math.sqrt(head_dim) * float(attn.q_norm.weight.detach().abs().max() * attn.k_norm.weight.detach().abs().max())
    assert largest[qk_norm] <= bound * (1 + 1e-5)
    assert largest["none"] > 10 * bound, "without QK-norm the same weights must break the bound"


def test_qk_norm_and_placement_options_are_checked():
    from normbench.errors import ConfigError

    with pytest.raises(ConfigError, match="model.qk_norm=bn cannot normalize queries and keys.*allowed: none, gn, ln, rms, scale"):
        ModelConfig(qk_norm="bn").validate()
    with pytest.raises(ConfigError, match="model.qk_norm=dyt cannot"):
        ModelConfig(qk_norm="dyt").validate()
    with pytest.raises(ConfigError, match="unknown model.qk_norm 'foo'"):
        ModelConfig(qk_norm="foo").validate()


# ---------------------------------------------------------------- diagnostics


def stats_step(tmp_path, *overrides):
    """One statistics step of a tiny run, and the model and batch it ran on (rebuilt by hand)."""
    cfg = parse_config(compose_cfg(tiny("train.grad_clip=0", "model.n_layer=2", *overrides)))
    state = Run(cfg, tmp_path / "run")
    stats = LayerStats(state.model)
    record_gen = state.batch_gen.get_state()
    attn_inputs = []
    hooks = [b.attn.register_forward_pre_hook(lambda m, args: attn_inputs.append(args[0].detach())) for b in state.model.blocks]
    weights = {n: t.detach().clone() for n, t in state.model.state_dict().items()}
    _, grad_norm = state.train_step(stats)
    for h in hooks:
        h.remove()
    state.batch_gen.set_state(record_gen)
    x, y = state.data.train_batch(state.tcfg.batch_size, state.batch_gen)
    return stats.record(0, grad_norm, 0.0), weights, attn_inputs, x, y, state


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
        assert record["layers"][i]["max_attn_logit"] == pytest.approx(float(logits[..., allowed].max()), rel=1e-5)
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


# ---------------------------------------------------------------- placements against hand-built blocks


def hand_pre(block, x, scale=1.0):
    x = x + block.attn(ln(block.norm_attn, x) * scale)
    return x + block.mlp(ln(block.norm_mlp, x) * scale)


def hand_post(block, x):
    x = ln(block.norm_attn, x + block.attn(x))
    return ln(block.norm_mlp, x + block.mlp(x))


def ln(norm, x):
    return (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt() * norm.weight + norm.bias


def run_by_hand(model, idx, block_fn):
    x = model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[1]))
    for layer, block in enumerate(model.blocks, start=1):
        x = block_fn(layer, block, x)
    return model.head(ln(model.norm_final, x))


@pytest.mark.parametrize("placement, post_fraction, block_fn", [
    ("lns", None, lambda l, b, x: hand_pre(b, x, scale=1 / math.sqrt(l))),
    ("mixln", 0.25, lambda l, b, x: hand_post(b, x) if l <= 1 else hand_pre(b, x)),
    ("mixln", 0.5, lambda l, b, x: hand_post(b, x) if l <= 2 else hand_pre(b, x)),
    ("mixln", 0.0, lambda l, b, x: hand_pre(b, x)),
    ("mixln", 1.0, lambda l, b, x: hand_post(b, x)),
    ("reordered", None, lambda l, b, x: (lambda x: x + ln(b.norm_mlp_out, b.mlp(x)))(x + ln(b.norm_attn_out, b.attn(x)))),
])
def test_new_placements_match_hand_built_blocks(placement, post_fraction, block_fn):
    options = {} if post_fraction is None else {"post_fraction": post_fraction}
    model = build(placement, **options)
    randomize_norms(model)
    idx = torch.randint(16, (2, 12))
    with torch.no_grad():
        assert torch.allclose(model(idx)[0], run_by_hand(model, idx, block_fn), atol=1e-5)


def test_layer_norm_scaling_has_no_new_parameters():
    assert build("lns").num_params() == build("pre").num_params()


# ---------------------------------------------------------------- every new option trains and stays causal


@pytest.mark.parametrize("overrides", [
    *([f"model.qk_norm={n}", "placement=reordered"] for n in qk_norms()),
    ["model.qk_norm=rms", "norm=bn", "placement=post"],
    ["model.qk_norm=ln", "placement=mixln", "placement.post_fraction=0.5", "model.n_layer=4"],
    ["train.z_loss=1e-4", "placement=lns"],
])
def test_new_options_train_and_eval_mode_is_causal(tmp_path, overrides):
    summary = train_tiny(tmp_path, *overrides, "train.steps=6", "train.log_every=3", "train.eval_every=6")
    assert summary["status"] == "completed" and math.isfinite(summary["final_val_loss"])
    assert summary["causal_leak"]["eval"] < LEAK_TOLERANCE


# ---------------------------------------------------------------- bad input through the CLI

BAD = [
    (["model.qk_norm=foo"], "unknown model.qk_norm 'foo'; allowed: none, gn, ln, rms, scale"),
    (["model.qk_norm=bn"], "model.qk_norm=bn cannot normalize queries and keys (batch statistics, which mix tokens); allowed: none, gn, ln, rms, scale"),
    (["placement=mixln", "placement.post_fraction=1.5"], "placement.post_fraction must be a number in [0, 1], got 1.5"),
    (["placement=mixln", "placement.post_fraction=-0.1"], "placement.post_fraction must be a number in [0, 1], got -0.1"),
    (["+placement.post_fraction=0.5"], "placement 'pre' has no option post_fraction; allowed: placement.final_norm"),
    (["train.z_loss=-1"], "train.z_loss must be >= 0, got -1"),
]


@pytest.mark.parametrize("overrides, message", BAD)
def test_bad_input_is_one_line(tmp_path, overrides, message):
    result = CliRunner().invoke(app, ["train", *tiny(*overrides), f"hydra.run.dir={tmp_path}"])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "metrics.jsonl").exists()


def test_every_placement_is_in_the_registry():
    assert {"lns", "mixln", "reordered"} <= set(PLACEMENTS)

"""The attention options of issue 25 against hand computations: the gated attention output
(model.attn_gate), QK-norm over one head or all heads (model.qk_norm_scope), the norm on V
(model.v_norm), HybridNorm (placement=hybrid), and the logits before the soft-cap (``*_raw``)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import SYNTH, compose_cfg, randomize_norms, read_metrics, stats_step
from omegaconf import OmegaConf

from normbench.core.errors import ConfigError
from normbench.model.causality import causal_leak
from normbench.model.gpt import GPT
from normbench.report.load import load_runs
from normbench.training.config import load_group, parse_config
from normbench.training.loop import train
from normbench.training.summary import LEAK_TOLERANCE

VOCAB = 64
EPS = 1e-6  # RMSNorm's eps (conf/norm/rms.yaml)

# Each new option as model overrides and the placement it goes with.
OPTIONS = {
    "attn_gate": ({"attn_gate": True}, "pre"),
    "qk_norm_flat": ({"qk_norm": "rms", "qk_norm_scope": "flat"}, "pre"),
    "v_norm": ({"v_norm": "rms"}, "pre"),
    "hybrid": ({}, "hybrid"),
}


def model_with(option: str, norm: str = "rms", **extra) -> GPT:
    overrides, placement = OPTIONS[option]
    torch.manual_seed(0)
    model = GPT(
        load_group("model", "micro", arch="llama", **{**overrides, **extra}),
        VOCAB,
        {"name": norm},
        {"name": placement, "final_norm": True},
    )
    randomize_norms(model)
    return model


def rms_by_hand(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * gain over the last dimension."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * gain


def by_heads(t: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, T, C) -> (B, n_head, T, C / n_head)."""
    B, T, C = t.shape
    return t.view(B, T, n_head, C // n_head).transpose(1, 2)


# ---------------------------------------------------------------- the options against the formula


def test_attention_gate_multiplies_each_channel_of_each_head_by_sigmoid_of_the_input():
    """Y' = SDPA(Q, K, V) ⊙ sigmoid(x W_g + b), elementwise (one gate per channel of every head), then W_o."""
    attn = model_with("attn_gate").blocks[0].attn
    C = attn.qkv.in_features
    assert attn.gate.weight.shape == (C, C), "elementwise: a gate for every channel of every head"
    assert model_with("v_norm").blocks[0].attn.gate is None, "off by default: no gate, no parameters"
    x = torch.randn(2, 10, C)
    with torch.no_grad():
        q, k, v = attn.heads(x)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 10, C)
        gate = 1 / (1 + torch.exp(-(x @ attn.gate.weight.T)))  # llama: no bias
        assert torch.allclose(attn(x), (y * gate) @ attn.proj.weight.T, atol=1e-6)
        # gpt2 with biases: the gate has one too.
        attn = (
            GPT(load_group("model", "micro", attn_gate=True), VOCAB, {"name": "ln"}, {"name": "pre"})
            .blocks[0]
            .attn
        )
        torch.nn.init.normal_(attn.gate.bias)
        q, k, v = attn.heads(x)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 10, C)
        gate = 1 / (1 + torch.exp(-(x @ attn.gate.weight.T + attn.gate.bias)))
        assert torch.allclose(attn(x), (y * gate) @ attn.proj.weight.T + attn.proj.bias, atol=1e-6)


def test_flat_qk_norm_normalizes_all_heads_together_and_head_scope_each_head():
    model = model_with("qk_norm_flat")
    attn = model.blocks[0].attn
    C, H = attn.qkv.in_features, attn.n_head
    assert attn.q_norm.weight.shape == (C,), "flat: one gain per channel of d_model (OLMo 2)"
    x = torch.randn(3, 8, C) * 5
    with torch.no_grad():
        raw_q, raw_k, _ = (x @ attn.qkv.weight.T).split(C, dim=-1)
        q, k, _ = attn.heads(x)
        # Rotary embeddings act after the norm; position 0 is not rotated.
        for got, raw, norm in ((q, raw_q, attn.q_norm), (k, raw_k, attn.k_norm)):
            want = attn.rotary(by_heads(rms_by_hand(raw, norm.weight), H))
            assert torch.allclose(got, want, atol=1e-5)
        # Per head the RMS is not 1 (the heads share one normalizer); over all heads it is.
        unscaled = rms_by_hand(raw_q, 1.0)
        assert torch.allclose(unscaled.pow(2).mean(-1), torch.ones(3, 8), atol=1e-4)
        assert not torch.allclose(by_heads(unscaled, H).pow(2).mean(-1), torch.ones(3, H, 8), atol=1e-2)
    head = model_with("qk_norm_flat", qk_norm_scope="head").blocks[0].attn
    assert head.q_norm.weight.shape == (C // H,), "head: one gain vector over head_dim shared by the heads"


def test_v_norm_normalizes_each_head_of_the_values():
    attn = model_with("v_norm").blocks[0].attn
    C, H = attn.qkv.in_features, attn.n_head
    assert attn.v_norm.weight.shape == (C // H,) and not attn.qk_norm
    x = torch.randn(2, 8, C) * 3
    with torch.no_grad():
        raw_v = (x @ attn.qkv.weight.T).split(C, dim=-1)[2]
        _, _, v = attn.heads(x)
        assert torch.allclose(v, rms_by_hand(by_heads(raw_v, H), attn.v_norm.weight), atol=1e-5)


def test_hybrid_block_is_qkv_norm_attention_then_a_post_norm_mlp():
    """y = x + W_o Attn(LN(x W_q), LN(x W_k), LN(x W_v)); x' = LN(y) + MLP(LN(y)), LN over d_model."""
    model = model_with("hybrid", norm="ln")
    block, attn = model.blocks[0], model.blocks[0].attn
    C, H = attn.qkv.in_features, attn.n_head
    assert not hasattr(block, "norm_attn"), "no norm on the attention's input"
    x = torch.randn(2, 12, C)

    def ln(t, norm):
        return F.layer_norm(t, (C,), norm.weight, norm.bias, norm.ln.eps if hasattr(norm, "ln") else 1e-5)

    with torch.no_grad():
        raw = (x @ attn.qkv.weight.T).split(C, dim=-1)
        q, k, v = (by_heads(ln(t, n), H) for t, n in zip(raw, (attn.q_norm, attn.k_norm, attn.v_norm)))
        q, k = attn.rotary(q), attn.rotary(k)
        y = (
            x
            + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 12, C)
            @ attn.proj.weight.T
        )
        h = ln(y, block.norm_mlp)
        assert torch.allclose(block(x), h + block.mlp(h), atol=1e-5)


# ---------------------------------------------------------------- gradients, bf16, causality


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_gradients_reach_every_parameter_of_the_option(option):
    model = model_with(option)
    idx = torch.randint(VOCAB, (2, 16))
    model(idx[:, :-1], idx[:, 1:])[1].backward()
    names = {
        "attn_gate": ["gate"],
        "qk_norm_flat": ["q_norm", "k_norm"],
        "v_norm": ["v_norm"],
        "hybrid": ["q_norm", "k_norm", "v_norm"],
    }[option]
    for p in (getattr(model.blocks[0].attn, name).weight for name in names):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_bf16_autocast_stays_close_to_fp32(option):
    model = model_with(option)
    idx = torch.randint(VOCAB, (4, 32))
    with torch.no_grad():
        fp32 = model(idx)[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = model(idx)[0]
    assert bf16.dtype == torch.bfloat16
    # bf16 keeps 8 bits of mantissa: the logits move by a few hundredths, not by what the option does.
    assert (bf16.float() - fp32).abs().max() < 0.05 * fp32.abs().max()


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_the_option_is_causal_in_eval_and_train_mode(option):
    model = model_with(option)
    idx = torch.randint(VOCAB, (4, 32))
    assert causal_leak(model, idx, VOCAB, train_mode=False) < LEAK_TOLERANCE
    assert causal_leak(model, idx, VOCAB, train_mode=True) < LEAK_TOLERANCE


# ---------------------------------------------------------------- bad options


def test_bad_attention_options_are_refused_with_what_is_allowed():
    with pytest.raises(ConfigError, match=r"^unknown model.qk_norm_scope 'heads'; allowed: head, flat$"):
        load_group("model", qk_norm="rms", qk_norm_scope="heads").validate()
    with pytest.raises(
        ConfigError,
        match=(
            r"^model.v_norm=bn cannot normalize values \(batch statistics.*allowed: none, gn, ln, rms, "
            r"scale$"
        ),
    ):
        load_group("model", v_norm="bn").validate()
    with pytest.raises(ConfigError, match=r"^unknown model.v_norm 'foo'; allowed: none, gn, ln, rms, scale$"):
        load_group("model", v_norm="foo").validate()
    with pytest.raises(
        ConfigError, match=r"^model.attn_gate must be true or false, got 1; allowed: false, true$"
    ):
        dataclasses.replace(load_group("model"), attn_gate=1).validate()
    with pytest.raises(ConfigError, match=r"^placement=hybrid puts its own norm .* must be none; allowed: "):
        GPT(load_group("model", "micro", qk_norm="rms"), VOCAB, {"name": "rms"}, {"name": "hybrid"})
    with pytest.raises(ConfigError, match=r"^model.attn_gate: Value 'maybe' is not a valid bool"):
        parse_config(compose_cfg(["model.attn_gate=maybe"]))


# ---------------------------------------------------------------- the logits before the cap


def test_stats_record_the_logits_after_and_before_the_caps(tmp_path):
    """Each layer's largest attention logit q·k/sqrt(d) and the output logits' log Z, by hand from the
    step's own inputs and weights: raw before the cap, and after it what the softmax sees."""
    attn_cap, logit_cap = 0.02, 1.0  # at init the attention logits are a few hundredths
    record, weights, attn_inputs, x, _, state = stats_step(
        tmp_path, f"model.attn_softcap={attn_cap}", f"model.logit_softcap={logit_cap}"
    )
    n_head = state.cfg.model.n_head
    raws = []
    for i, inputs in enumerate(attn_inputs):
        prefix = f"blocks.{i}.attn.qkv."
        qkv = inputs @ weights[prefix + "weight"].T + weights[prefix + "bias"]
        q, k, _ = (by_heads(t, n_head) for t in qkv.split(qkv.shape[-1] // 3, dim=-1))
        logits = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(q.shape[-1])
        future = torch.ones(logits.shape[-1], logits.shape[-1], dtype=torch.bool).triu(1)
        raws.append(float(logits.masked_fill(future, -math.inf).max()))
        layer = record["layers"][i]
        assert layer["max_attn_logit_raw"] == pytest.approx(raws[-1], rel=1e-5)
        assert layer["max_attn_logit"] == pytest.approx(attn_cap * math.tanh(raws[-1] / attn_cap), rel=1e-5)
    assert record["max_attn_logit_raw"] == pytest.approx(max(raws), rel=1e-5)
    assert record["max_attn_logit"] < attn_cap < record["max_attn_logit_raw"]
    outputs = []
    with torch.no_grad():
        state.model.load_state_dict(weights)  # the weights the statistics step saw
        hook = state.model.head.register_forward_hook(lambda m, i, out: outputs.append(out.double()))
        state.model(x)
        hook.remove()
    raw = outputs[0]
    capped = logit_cap * torch.tanh(raw / logit_cap)
    assert record["max_log_z_raw"] == pytest.approx(float(raw.logsumexp(-1).max()), rel=1e-5)
    assert record["max_log_z"] == pytest.approx(float(capped.logsumexp(-1).max()), rel=1e-5)
    assert record["max_output_logit_raw"] == pytest.approx(float(raw.max()), rel=1e-5)
    assert record["max_output_logit"] == pytest.approx(float(capped.max()), rel=1e-5)


def test_without_a_cap_only_the_capped_names_are_written(tmp_path):
    record, *_ = stats_step(tmp_path)
    assert "max_attn_logit_raw" not in record and "max_log_z_raw" not in record
    assert all("max_attn_logit_raw" not in layer for layer in record["layers"])


def test_summary_carries_the_raw_peaks_and_a_report_fills_them_for_uncapped_and_older_runs(tmp_path):
    capped = [
        "model=tiny",
        "train.steps=4",
        "train.stats_every=2",
        "train.eval_every=4",
        "train.batch_size=8",
        "train.eval_batches=2",
        "train.progress=false",
        "train.device=cpu",
        *SYNTH,
    ]
    runs = {"cap": [*capped, "model.attn_softcap=0.01", "model.logit_softcap=0.5"], "plain": capped}
    summaries = {}
    for name, overrides in runs.items():  # what a job does: the run, then its config beside it
        cfg = compose_cfg(overrides)
        summaries[name] = train(parse_config(cfg), tmp_path / name)
        (tmp_path / name / "config.yaml").write_text(
            yaml.safe_dump(OmegaConf.to_container(cfg, resolve=True))
        )
    summary, plain = summaries["cap"], summaries["plain"]
    assert summary["max_attn_logit"] < 0.01 < summary["max_attn_logit_raw"]
    assert summary["max_log_z_raw"] is not None and summary["max_log_z_raw"] != summary["max_log_z"]
    assert "max_attn_logit_raw" not in plain and "max_log_z_raw" not in plain
    stats = [r for r in read_metrics(tmp_path / "cap") if r["kind"] == "stats"]
    assert all(r["max_attn_logit_raw"] >= r["max_attn_logit"] for r in stats)
    # An older run: its summary and records lack the raw fields.
    (tmp_path / "old").mkdir()
    for name in ("config.yaml", "metrics.jsonl"):
        (tmp_path / "old" / name).write_text((tmp_path / "plain" / name).read_text())
    (tmp_path / "old" / "summary.json").write_text(
        json.dumps({"status": "completed", "final_val_loss": 3.0, "max_attn_logit": 2.5, "max_log_z": 4.0})
    )
    data = load_runs([tmp_path / "cap", tmp_path / "plain", tmp_path / "old"], warn=print)
    runs = data.runs.set_index(data.runs["run_dir"].map(lambda d: d.rsplit("/", 1)[-1]))
    assert runs.loc["cap", "max_attn_logit_raw"] == pytest.approx(summary["max_attn_logit_raw"])
    for name in ("plain", "old"):  # without a cap, raw is the capped value
        assert runs.loc[name, "max_attn_logit_raw"] == runs.loc[name, "max_attn_logit"]
        assert runs.loc[name, "max_log_z_raw"] == runs.loc[name, "max_log_z"]
    assert data.logits["max_attn_logit_raw"].notna().all()
    alone = load_runs([tmp_path / "old"], warn=print)
    assert "max_attn_logit_raw" not in alone.runs, "a report of uncapped runs alone has no raw columns"


# ---------------------------------------------------------------- each option learns


@pytest.mark.slow  # four 100-step trainings
@pytest.mark.parametrize(
    "overrides",
    [
        ["model.attn_gate=true"],
        ["model.qk_norm=rms", "model.qk_norm_scope=flat"],
        ["model.v_norm=rms"],
        ["placement=hybrid"],
    ],
)
def test_each_option_learns_in_the_llama_model(tmp_path, overrides):
    """normbench train model=micro model.arch=llama <option> train.steps=100 (batch 8): the loss falls far
    below init."""
    cfg = compose_cfg(
        [
            "model=micro",
            "model.arch=llama",
            "norm=rms",
            *overrides,
            "train.steps=100",
            "train.batch_size=8",
            "train.eval_every=100",
            "train.eval_batches=2",
            "train.progress=false",
            "train.device=cpu",
            *SYNTH,
        ]
    )
    summary = train(parse_config(cfg), tmp_path)
    evals = [r["val_loss"] for r in read_metrics(tmp_path) if r["kind"] == "eval"]
    assert summary["status"] == "completed" and summary["causal_leak"]["eval"] < LEAK_TOLERANCE
    assert evals[-1] < evals[0] - 0.6, (
        evals
    )  # from ln 64 = 4.16 to 3.35 (v_norm), 3.25 (hybrid), below 3.17 (the others) here

"""μP (model.param=mup) and the coordinate check (normbench coordcheck).

References written out here: Tensor Programs V (Yang et al. 2022), Table 3, μP for Adam, in its
output-multiplier form, with m = d_model / base_width: hidden matrices' init std and Adam LR scaled
(std / sqrt(m) from gpt2's width-free N(0, 0.02), LR / m), embeddings, norm gains and biases as in SP,
attention logits q·k · sqrt(base_width / n_head) / head_dim, output logits times 1 / m.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import compose_cfg, tiny
from typer.testing import CliRunner

from normbench.cli import app
from normbench.coordcheck import coord_check, growth, parse_params, parse_widths
from normbench.core.errors import ConfigError
from normbench.core.identity import config_hash
from normbench.model.gpt import GPT
from normbench.model.norms import NORMS
from normbench.model.placements import PLACEMENTS
from normbench.training.config import load_group, parse_config
from normbench.training.loop import Run
from normbench.training.optim import build_optimizer, lr_factor

VOCAB = 64
HIDDEN = ("attn.qkv.weight", "attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight")


def mup_model(d_model: int, base_width: int, placement: str = "pre", **options) -> GPT:
    torch.manual_seed(0)
    cfg = load_group("model", "micro", d_model=d_model, param="mup", base_width=base_width, **options)
    return GPT(cfg, VOCAB, {"name": "ln"}, {"name": placement, "final_norm": placement != "deepnorm"})


# ---------------------------------------------------------------- sp is today's model


# Recorded on main at 4121532, before model.param existed: the sum of |weights| at init and the first
# five training losses of `tiny(model=micro, ...)`, seed 0 (Post-LN under the gpt2 init it then had).
# The tolerance only absorbs another CPU's float rounding; any change to the model, its init or the
# optimizer moves these by far more.
BEFORE = {
    (): (
        1657.1281557730138,
        [4.17733097076416, 4.100411891937256, 4.08245849609375, 4.014734745025635, 3.993896961212158],
    ),
    ("placement=post", "norm=rms", "model.init=gpt2", "model.tie_head=true"): (
        1593.1281557730138,
        [4.165657997131348, 4.144288539886475, 4.123541355133057, 4.067139625549316, 4.015585422515869],
    ),
    ("model.arch=llama", "model.init=xavier"): (
        7641.178532008304,
        [4.165156841278076, 4.157865047454834, 4.114455699920654, 4.094946384429932, 4.101080894470215],
    ),
}


@pytest.mark.parametrize("extra", list(BEFORE))
def test_param_sp_is_the_model_of_before_the_option(tmp_path, extra):
    run = parse_config(compose_cfg(tiny("model=micro", "model.param=sp", *extra)))
    state = Run(run, tmp_path / "run")
    assert state.model.readout_mult is None and all(b.attn.scale is None for b in state.model.blocks)
    init = sum(float(p.detach().double().abs().sum()) for p in state.model.parameters())
    losses = [float(state.train_step()[0]) for _ in range(5)]
    assert (init, losses) == (
        pytest.approx(BEFORE[extra][0], rel=1e-9),
        pytest.approx(BEFORE[extra][1], rel=1e-6),
    )
    # The optimizer of before: two groups at train.lr, decay on the matrices but the embeddings.
    decay, no_decay = state.optimizer.param_groups
    assert decay["lr"] == no_decay["lr"] == run.train.lr * lr_factor(5, run.train)
    assert {id(p) for p in decay["params"]} == {
        id(p) for n, p in state.model.named_parameters() if n.endswith(HIDDEN)
    }


def test_sp_and_base_width_null_keep_the_config_hash_and_mup_changes_it():
    base = config_hash(compose_cfg(["model=micro"]))
    assert config_hash(compose_cfg(["model=micro", "model.param=sp", "model.base_width=null"])) == base
    assert config_hash(compose_cfg(["model=micro", "model.param=mup", "model.base_width=32"])) != base


# -------------------------------------------------------------- μP's init, LR and multipliers, by the formula


@pytest.mark.parametrize("init", ["gpt2", "xavier"])
def test_mup_init_std_per_parameter_class(init):
    d, base, n_layer = 256, 32, 2
    m = d / base
    model = mup_model(d, base, init=init)
    checked = 0
    for name, p in model.named_parameters():
        if name in (
            "tok_emb.weight",
            "pos_emb.weight",
        ):  # input weights (and the tied readout): SP's N(0, 0.02)
            expected = 0.02
        elif name.endswith(".bias"):
            assert torch.all(p == 0), name
            continue
        elif "norm" in name:  # vector-like: gains start at 1, as in SP
            assert torch.all(p == 1), name
            continue
        else:  # hidden: variance ∝ 1/fan_in, SP's at the base width
            fan_out, fan_in = p.shape
            if init == "xavier":  # sqrt(2 / (fan_in + fan_out)) already falls as 1/sqrt(width)
                expected = math.sqrt(2.0 / (fan_in + fan_out))
            else:
                residual = name.endswith(("attn.proj.weight", "mlp.proj.weight"))
                expected = (0.02 / math.sqrt(2 * n_layer) if residual else 0.02) / math.sqrt(m)
        assert p.std().item() == pytest.approx(expected, rel=0.03), (name, p.std().item(), expected)
        checked += 1
    assert checked == 2 + 4 * n_layer


def test_deepnorm_keeps_its_own_init_under_mup():
    """DeepNorm's Xavier-normal x beta already scales as 1/sqrt(fan): μP leaves those matrices as SP has
    them."""
    torch.manual_seed(0)
    sp = GPT(
        load_group("model", "micro", d_model=256),
        VOCAB,
        {"name": "ln"},
        {"name": "deepnorm", "final_norm": False},
    )
    mup = mup_model(256, 32, "deepnorm")
    for (name, a), b in zip(sp.named_parameters(), mup.parameters()):
        assert torch.equal(a, b), name


def test_mup_lr_multipliers_per_parameter_class_follow_the_schedule():
    d, base = 128, 32
    model = mup_model(d, base)
    tcfg = load_group("train", lr=1e-2, warmup_steps=2, steps=10)
    optimizer = build_optimizer(model, tcfg, torch.device("cpu"))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, tcfg))
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    for _ in range(4):
        optimizer.step()
        schedule.step()
    factor = lr_factor(4, tcfg)
    for name, p in model.named_parameters():
        group = group_of[id(p)]
        hidden = name.endswith(HIDDEN)
        assert group["lr"] == pytest.approx(tcfg.lr * factor * (base / d if hidden else 1.0)), name
        # AdamW decays by lr x wd per step: the hidden matrices' wd times m keeps that the base width's.
        assert group["weight_decay"] == pytest.approx(tcfg.weight_decay * d / base if hidden else 0.0), name
    assert optimizer.param_groups[0]["lr"] == pytest.approx(tcfg.lr * factor)  # the one the log reports


def test_mup_readout_and_attention_multipliers_by_hand():
    """The forward written out: attention softmax(q·kᵀ · sqrt(base / n_head) / head_dim), logits / m."""
    d, base = 128, 32
    model = mup_model(d, base).eval()
    n_head = model.cfg.n_head
    head_dim = d // n_head
    idx = torch.randint(VOCAB, (2, 16))
    future = torch.ones(16, 16, dtype=torch.bool).triu(1)
    with torch.no_grad():
        x = model.tok_emb(idx) + model.pos_emb(torch.arange(16))
        for block in model.blocks:
            q, k, v = block.attn.heads(block.norm_attn(x))
            weights = ((q @ k.transpose(-2, -1)) * math.sqrt(base / n_head) / head_dim).masked_fill(
                future, -math.inf
            )
            y = weights.softmax(-1) @ v
            x = x + block.attn.proj(y.transpose(1, 2).reshape(2, 16, d))
            x = x + block.mlp(block.norm_mlp(x))
        by_hand = F.linear(model.norm_final(x), model.tok_emb.weight) * (base / d)
        assert torch.allclose(model(idx)[0], by_hand, atol=1e-6)


def test_mup_at_its_base_width_is_sp():
    torch.manual_seed(0)
    sp = GPT(load_group("model", "micro"), VOCAB, {"name": "ln"}, {"name": "pre"})
    mup = mup_model(sp.cfg.d_model, sp.cfg.d_model)
    idx = torch.randint(VOCAB, (2, 16))
    assert torch.allclose(sp(idx)[0], mup(idx)[0], atol=1e-6)


@pytest.mark.parametrize("norm", sorted(NORMS))
@pytest.mark.parametrize("placement", sorted(set(PLACEMENTS) - {"ngpt"}))  # nGPT refuses μP (test_placements)
def test_every_norm_and_placement_builds_and_runs_under_mup(norm, placement):
    torch.manual_seed(0)
    cfg = load_group("model", "tiny", d_model=64, n_layer=2, param="mup", base_width=32)
    model = GPT(cfg, VOCAB, {"name": norm}, {"name": placement, "final_norm": placement != "deepnorm"})
    idx = torch.randint(VOCAB, (4, cfg.block_size))
    _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    assert math.isfinite(loss.item()) and model.readout_mult == 0.5


# ---------------------------------------------------------------- the coordinate check


def test_coordinate_check_is_flat_under_mup_and_grows_under_sp():
    """3 Adam steps at lr 1e-2, widths 32 and 256 (n_head fixed): under μP every block's output RMS
    moves less than 2x, under SP the widest model's blows up (TP5 Fig. 5, microsoft/mup's check)."""
    overrides = tiny(
        "model=micro", "model.n_layer=2", "model.block_size=16", "train.batch_size=4", "train.lr=1e-2"
    )
    table = coord_check(overrides, [32, 256], steps=3, params=["sp", "mup"])
    assert sorted(table.step.unique()) == [0, 1, 2, 3] and set(table.layer) == {"block1", "block2", "logits"}
    ratios = growth(table).set_index(["param", "layer"]).ratio
    for layer in ("block1", "block2", "logits"):
        assert 0.5 < ratios["mup", layer] < 2.0, ratios
    assert min(ratios["sp", "block1"], ratios["sp", "block2"]) > 8.0, ratios
    # Same seed, same data: the narrowest width's init is the same model under both (base_width = 32).
    first = table[(table.width == 32) & (table.step == 0)].set_index(["layer", "param"]).rms.unstack()
    assert first["sp"].tolist() == pytest.approx(first["mup"].tolist())


def test_coordcheck_command_writes_csv_and_chart(tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "coordcheck",
            *tiny("model=micro", "model.n_layer=1", "model.block_size=8", "train.batch_size=2"),
            "--widths",
            "16,32",
            "--steps",
            "1",
            "--param",
            "mup",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    csv = (tmp_path / "coordcheck.csv").read_text().splitlines()
    assert csv[0] == "param,width,step,layer,rms" and len(csv) == 1 + 2 * 2 * 2
    assert (tmp_path / "coordcheck.png").stat().st_size > 0
    assert "mup: rms at width 32 / width 16 after 1 steps" in " ".join(result.output.split())


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "options, message",
    [
        ({"param": "ntk"}, "unknown model.param 'ntk'; allowed: sp, mup"),
        ({"param": "mup", "base_width": 0}, "model.base_width must be a positive integer (or null), got 0"),
        (
            {"param": "mup", "base_width": -32},
            "model.base_width must be a positive integer (or null), got -32",
        ),
        ({"param": "mup", "base_width": None}, "model.param=mup needs model.base_width"),
    ],
)
def test_bad_param_options_are_refused_in_one_line(options, message):
    cfg = dataclasses.replace(load_group("model", "micro"), **options)
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--widths", "32,x"], "--widths takes two or more positive integers, got '32,x'"),
        (["--widths", "0,32"], "--widths takes two or more positive integers, got '0,32'"),
        (["--widths", "-32,64"], "--widths takes two or more positive integers, got '-32,64'"),
        (["--widths", "64"], "--widths takes two or more positive integers, got '64'"),
        (["--param", "ntk"], "unknown --param 'ntk'; allowed: sp, mup, both"),
        (["--steps", "0"], "--steps must be a positive integer, got 0"),
        (
            ["model.param=mup", "model.base_width=0"],
            "model.base_width must be a positive integer (or null), got 0",
        ),
        (["--lr", "1"], "unknown option --lr"),
    ],
)
def test_bad_coordcheck_input_is_one_line(tmp_path, args, message):
    result = CliRunner().invoke(app, ["coordcheck", *tiny("model=micro"), *args, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()) and "Traceback" not in result.output
    assert not (tmp_path / "coordcheck.csv").exists()


def test_widths_and_params_parse():
    assert parse_widths("128,32, 64") == [32, 64, 128]
    assert parse_params("both") == ["sp", "mup"] and parse_params("mup") == ["mup"]

"""Each placement under its own recipe: the init a placement's literature trains it with is the model's
unless model.init says otherwise; Post-LN against a plain PyTorch Post-LN; and every placement learns
on a character corpus at its best rate of a short grid."""

from __future__ import annotations

import math
import random
from collections import Counter

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import compose_cfg, train_tiny
from torch import nn

from normbench.core.identity import config_hash
from normbench.model.gpt import GPT
from normbench.model.placements import PLACEMENTS
from normbench.report.tables import default_group_keys
from normbench.training.config import parse_config


def composed(*overrides: str):
    return parse_config(compose_cfg(list(overrides)))


# ---------------------------------------------------------------- the init follows the placement


@pytest.mark.parametrize(
    ("placement", "init", "tied"),
    [("pre", "gpt2", True), ("post", "bert", False), ("deepnorm", "gpt2", True)],
)
def test_the_model_takes_its_placements_own_init_and_head_by_default(placement, init, tied):
    run = composed(f"placement={placement}")
    assert (run.model.init, run.model.tie_head) == (init, tied)
    model = GPT(run.model, 40, run.norm, run.placement)
    assert (model.head.weight is model.tok_emb.weight) == tied


def test_an_init_set_on_the_command_line_wins_over_the_placements():
    run = composed("placement=post", "model.init=gpt2", "model.tie_head=true")
    assert (run.model.init, run.model.tie_head) == ("gpt2", True)
    assert composed("placement=pre", "model.init=bert").model.init == "bert"


def test_the_recipe_keeps_the_identity_of_every_stored_run():
    """Pre-LN's recipe is what every stored run had, and hashes as before; Post-LN under GPT-2's recipe,
    set on the command line, is the Post-LN stored before recipes existed; under its own it is a new
    configuration, never a stored gpt2-init result."""
    pre = compose_cfg(["placement=pre"])
    without = compose_cfg(["placement=pre", "~placement.init"])
    assert config_hash(pre) == config_hash(without)
    stored = compose_cfg(["placement=post", "model.init=gpt2", "~placement.init", "~placement.tie_head"])
    assert config_hash(stored) == config_hash(
        compose_cfg(["placement=post", "model.init=gpt2", "model.tie_head=true"])
    )
    assert config_hash(compose_cfg(["placement=post"])) != config_hash(stored)


def _std(module: nn.Linear) -> float:
    return module.weight.std().item()


def test_bert_init_leaves_the_residual_projections_unscaled_and_gpt2_divides_them():
    """BERT's N(0, 0.02) on every matrix; GPT-2's the same but 0.02 / sqrt(2 n_layer) on the two
    projections into the residual stream (8 layers: 0.005)."""
    torch.manual_seed(0)
    for init, proj_std in (("bert", 0.02), ("gpt2", 0.02 / math.sqrt(16))):
        run = composed("placement=post", f"model.init={init}", "model.n_layer=8")
        model = GPT(run.model, 64, run.norm, run.placement)
        block = model.blocks[3]
        assert _std(block.attn.qkv) == pytest.approx(0.02, rel=0.05)
        assert _std(block.mlp.fc) == pytest.approx(0.02, rel=0.05)
        assert _std(block.attn.proj) == pytest.approx(proj_std, rel=0.05)
        assert _std(block.mlp.proj) == pytest.approx(proj_std, rel=0.05)
        assert model.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.05)
        assert model.head.weight.std().item() == pytest.approx(0.02, rel=0.05)  # untied: its own
        assert block.attn.qkv.bias.abs().max().item() == 0.0


def test_a_run_says_which_init_it_had_and_whether_it_was_its_placements(tmp_path):
    post = {"init": "bert", "tie_head": False}
    own = train_tiny(tmp_path / "own", "placement=post", "train.steps=2")
    assert own["recipe"] == {**post, "placement_own": post}
    assert (tmp_path / "own" / "config.yaml").read_text().count("init: bert") == 2
    other = train_tiny(tmp_path / "other", "placement=post", "model.init=gpt2", "train.steps=2")
    assert other["recipe"] == {"init": "gpt2", "tie_head": False, "placement_own": post}


def test_the_report_counts_pre_and_post_under_their_own_recipes_as_two_configurations():
    runs = pd.DataFrame(
        {
            "norm": ["ln"] * 4,
            "placement": ["pre", "pre", "post", "post"],
            "model.init": ["gpt2", "gpt2", "bert", "bert"],
            "model.tie_head": [True, True, False, False],
            "train.lr": [1e-3, 3e-3, 1e-3, 3e-3],
        }
    )
    keys = ["norm", "placement", "model.init", "model.tie_head", "train.lr"]
    assert default_group_keys(runs, keys) == ["placement", "train.lr"]
    runs.loc[3, "model.init"] = "gpt2"  # post under two inits: the init is a configuration of its own
    assert default_group_keys(runs, keys) == ["placement", "model.init", "train.lr"]


# ---------------------------------------------------------------- Post-LN against plain PyTorch


class PlainPostBlock(nn.Module):
    """LN(x + Attn(x)), then LN(x + MLP(x)): the original Transformer's block, written out."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        weights = ((q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)).masked_fill(~mask, -math.inf)
        attn = (weights.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = self.ln1(x + self.attn_proj(attn))
        return self.ln2(x + self.mlp_proj(F.gelu(self.fc(x))))


class PlainPostLN(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, block: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(PlainPostBlock(d, heads) for _ in range(layers))
        self.head = nn.Linear(d, vocab, bias=False)  # a head of its own, as Post-LN's recipe

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def _copy_into_plain(model: GPT, plain: PlainPostLN) -> None:
    with torch.no_grad():
        plain.tok.weight.copy_(model.tok_emb.weight)
        plain.pos.weight.copy_(model.pos_emb.weight)
        plain.head.weight.copy_(model.head.weight)
        for ours, theirs in zip(model.blocks, plain.blocks):
            pairs = [
                (ours.attn.qkv, theirs.qkv),
                (ours.attn.proj, theirs.attn_proj),
                (ours.mlp.fc, theirs.fc),
                (ours.mlp.proj, theirs.mlp_proj),
                (ours.norm_attn, theirs.ln1),
                (ours.norm_mlp, theirs.ln2),
            ]
            for a, b in pairs:
                b.weight.copy_(a.weight)
                b.bias.copy_(a.bias)


def test_post_ln_trains_step_for_step_as_a_plain_pytorch_post_ln():
    """normbench's Post-LN under its own init, and a Post-LN written here holding the same weights,
    trained by the same AdamW on the same batches: the same losses to 1e-5 for the first steps."""
    run = composed("placement=post", "model=tiny")
    assert run.model.init == "bert"
    torch.manual_seed(0)
    m = run.model
    model = GPT(m, 40, run.norm, run.placement)
    plain = PlainPostLN(40, m.d_model, m.n_head, m.n_layer, m.block_size)
    _copy_into_plain(model, plain)
    opts = [torch.optim.AdamW(net.parameters(), lr=3e-3, betas=(0.9, 0.95)) for net in (model, plain)]
    data = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randint(40, (4, m.block_size + 1), generator=data)
        ours = model(x[:, :-1], x[:, 1:])[1]
        theirs = plain(x[:, :-1], x[:, 1:])
        assert ours.item() == pytest.approx(theirs.item(), abs=1e-5)
        for loss, opt in zip((ours, theirs), opts):
            opt.zero_grad()
            loss.backward()
            opt.step()


# ---------------------------------------------------------------- every placement learns on text

# Forty words of two or three syllables: spelling to learn, and a character frequency far from uniform
SYLLABLES = ("ka", "lo", "mi", "ren", "to", "sa", "de", "vin", "qu", "ath")
WORDS = ["".join(random.Random(i).choices(SYLLABLES, k=2 + i % 2)) for i in range(40)]


@pytest.fixture(scope="module")
def char_corpus(tmp_path_factory):
    """Sentences of a small vocabulary, in lines and punctuation: learnable spelling, and a unigram
    (character-frequency) loss the tests compare with."""
    rng = random.Random(0)
    lines = []
    for _ in range(3000):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 9))]
        lines.append(" ".join(words).capitalize() + rng.choice(".,;!?"))
    text = "\n".join(lines)
    counts = Counter(text[: int(0.9 * len(text))])
    total = sum(counts.values())
    unigram = -sum(c / total * math.log(c / total) for c in counts.values())
    path = tmp_path_factory.mktemp("corpus") / "lines.txt"
    path.write_text(text)
    return path, unigram


LEARN_RATES = (1e-3, 3e-3, 1e-2)


@pytest.mark.slow
@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_every_placement_learns_characters_at_its_best_rate_of_a_short_grid(tmp_path, char_corpus, placement):
    """Under its default (own) init, on text: the best of three rates ends a nat or more below the
    unigram loss (about 2.9 nat here); a diverged run counts as infinite."""
    path, unigram = char_corpus
    losses = []
    for lr in LEARN_RATES:
        summary = train_tiny(
            tmp_path / f"lr{lr:g}",
            "data=text",
            f"data.path={path}",
            f"placement={placement}",
            "model=micro",
            "train.steps=150",
            "train.batch_size=16",
            "train.eval_every=150",
            "train.eval_batches=4",
            "train.warmup_steps=15",
            f"train.lr={lr}",
            "train.end_checks=false",
        )
        loss = summary["final_val_loss"]
        losses.append(loss if loss is not None and math.isfinite(loss) else math.inf)
    assert min(losses) < unigram - 1.0, (
        f"{placement}: {dict(zip(LEARN_RATES, losses))} vs unigram {unigram:.2f}"
    )

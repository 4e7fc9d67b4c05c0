"""Post-LN under each init: which part of GPT-2's recipe keeps a Post-LN model at the unigram loss.

GPT-2's init (``model.init=gpt2``) is N(0, 0.02) with the residual projections scaled by
1/sqrt(2 n_layer) and the head tied to the token embedding. The script trains normbench's own model
(built from the config ``normbench train`` composes) under each variant in one plain loop, so the
variants differ in the init and the head alone: ``model.init`` (gpt2, or bert: no residual scaling) and
``model.tie_head`` (tied, or a head of its own, N(0, 0.02)); one more with BERT's LayerNorm on the
embeddings. Beside them a plain PyTorch model written here
(N(0, 0.02) everywhere, no residual scaling, untied head), Post-LN and Pre-LN, as an outside reference.

The loop is the default recipe's: AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), linear warm-up
then cosine to min_lr, clipping at 1.0, on characters of a text file (the last 10% held out). Prints one
row per variant and seed: the final validation loss (mean of 20 held-out batches) and the corpus's
unigram loss, the loss of a model that ignores its input.

    python benchmarks/post_ln_init.py --text ../shared/data/tinyshakespeare.txt [--batch 32] [--seeds 0]
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn

from normbench.core.configtree import compose
from normbench.model.gpt import GPT
from normbench.training.config import parse_config

VARIANTS = {
    # name: normbench's overrides; "plain *" are the models written below
    "post gpt2 tied": ["placement=post", "model.init=gpt2", "model.tie_head=true"],
    "post gpt2 untied": ["placement=post", "model.init=gpt2", "model.tie_head=false"],
    "post bert tied": ["placement=post", "model.init=bert", "model.tie_head=true"],
    "post bert untied (post's own)": ["placement=post"],
    "post bert tied embnorm": ["placement=post", "model.tie_head=true", "+placement.embedding_norm=true"],
    "pre gpt2 tied (pre's own)": ["placement=pre"],
    "plain post": ["placement=post"],
    "plain pre": ["placement=pre"],
}


class PlainBlock(nn.Module):
    def __init__(self, d: int, heads: int, post: bool):
        super().__init__()
        self.post, self.heads = post, heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        if self.post:
            x = self.ln1(x + self.attn(x))
            return self.ln2(x + self.mlp(x))
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class PlainGPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, block: int, post: bool):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(PlainBlock(d, heads, post) for _ in range(layers))
        self.final = nn.Identity() if post else nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.final(x))
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def build(variant: str, vocab: int, overrides: list[str]):
    run = parse_config(compose([*VARIANTS[variant], *overrides]))
    m = run.model
    if variant.startswith("plain"):
        post = run.placement["name"] == "post"
        return PlainGPT(vocab, m.d_model, m.n_head, m.n_layer, m.block_size, post), run
    return GPT(m, vocab, run.norm, run.placement), run


def batches(source: torch.Tensor, n: int, T: int, gen: torch.Generator):
    while True:
        starts = torch.randint(len(source) - T - 1, (n,), generator=gen)
        x = torch.stack([source[s : s + T + 1] for s in starts])
        yield x[:, :-1], x[:, 1:]


def final_val_loss(model: nn.Module, run, train: torch.Tensor, val: torch.Tensor, args, seed: int) -> float:
    """The default recipe's loop: AdamW, decay on matrices, warm-up then cosine to min_lr, clipping."""
    t, T = run.train, run.model.block_size
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(t.beta1, t.beta2))
    gen = torch.Generator().manual_seed(seed)
    train_batches, min_lr = batches(train, args.batch, T, gen), t.min_lr * args.lr / t.lr
    for step in range(args.steps):
        if step < t.warmup_steps:
            lr = args.lr * (step + 1) / t.warmup_steps
        else:
            frac = (step - t.warmup_steps) / max(args.steps - t.warmup_steps, 1)
            lr = min_lr + 0.5 * (args.lr - min_lr) * (1 + math.cos(math.pi * frac))
        for group in opt.param_groups:
            group["lr"] = lr
        _, loss = model(*next(train_batches))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
    model.eval()
    val_batches = batches(val, args.batch, T, gen)
    with torch.no_grad():
        return sum(model(*next(val_batches))[1].item() for _ in range(20)) / 20


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--text", required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("overrides", nargs="*", help="normbench overrides (default: model=mini)")
    args = parser.parse_args()

    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]
    counts = torch.bincount(train, minlength=len(chars)).double()
    p = counts[counts > 0] / counts.sum()
    unigram = -(p * p.log()).sum().item()
    print(f"unigram loss {unigram:.3f} nats; batch {args.batch}, {args.steps} steps, lr {args.lr:g}")
    for variant in args.variants:
        for seed in args.seeds:
            torch.manual_seed(seed)
            model, run = build(variant, len(chars), args.overrides)
            loss = final_val_loss(model, run, train, val, args, seed)
            print(f"{variant:30s} seed {seed}: final val loss {loss:.3f}", flush=True)


if __name__ == "__main__":
    main()

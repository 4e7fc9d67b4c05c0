"""A bare GPT-2 small training loop in plain PyTorch, nanoGPT's recipe: the figure normbench's
``model=gpt2 train=gpt2`` step is held to (scripts/gpu_check.sh, stage gpt2).

The model is nanoGPT's (pre-LayerNorm blocks, learned positions, GELU MLP, SDPA with
``is_causal``, the head tied to the embedding, the vocabulary padded to 50,304), trained with fused
AdamW (6e-4, betas 0.9/0.95, weight decay 0.1 on matrices), bf16 autocast around the forward,
``torch.compile``, gradient accumulation and clipping at 1.0. Tokens are drawn at random on the device:
the loop times the step alone. Prints one JSON line: tokens/s (median of the timed steps), MFU with
nanoGPT's FLOPs per token (6 N + 12 L d T, N without the position embedding) against the device's
datasheet peak (normbench.training.perf.peak_flops, as normbench's own MFU), and the peak memory.

    python benchmarks/gpt2_bare.py [--micro 16] [--accum 4] [--steps 30] [--no-compile]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from normbench.training.perf import peak_flops

VOCAB, LAYERS, HEADS, WIDTH = 50304, 12, 12, 768


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.fc, self.out = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln_2(x))))


class GPT2(nn.Module):
    def __init__(self, block_size: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(block_size, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() == 2:  # GPT-2's init: 0.02, the residual projections scaled by depth
                std = 0.02 / (2 * LAYERS) ** 0.5 if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, VOCAB), targets.view(-1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--micro", type=int, default=16, help="sequences per forward+backward")
    parser.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="steps not timed (compilation)")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    model = GPT2(args.block).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=6e-4,
        betas=(0.9, 0.95),
        fused=device.type == "cuda",
    )
    step_model = torch.compile(model) if args.compile else model
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    def step() -> None:
        for _ in range(args.accum):
            x = torch.randint(VOCAB - 47, (args.micro, args.block + 1), device=device)  # GPT-2's 50,257
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = step_model(x[:, :-1], x[:, 1:])
            (loss / args.accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = []
    for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    tokens = args.micro * args.accum * args.block
    tokens_per_s = tokens / statistics.median(times)
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    flops = 6 * n + 12 * LAYERS * WIDTH * args.block
    peak, source = peak_flops(device, dtype)
    print(
        json.dumps(
            {
                "loop": "bare",
                "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                "compiled": args.compile,
                "tokens_per_step": tokens,
                "tokens_per_s": tokens_per_s,
                "step_ms_p50": 1000 * statistics.median(times),
                "mfu": flops * tokens_per_s / peak,
                "peak_flops": peak,
                "peak_flops_source": source,
                "peak_mem_mb": torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None,
            }
        )
    )


if __name__ == "__main__":
    main()

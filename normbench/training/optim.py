"""The optimizer and its learning-rate schedule: AdamW's parameter groups and the warm-up + cosine factor.

The training loop (normbench.training.loop), the batched seeds (normbench.training.batched) and the
coordinate check build their optimizers here, so every one decays and schedules alike.
"""

from __future__ import annotations

import math

import torch

from normbench.model.gpt import GPT, hidden_weights
from normbench.training.config import TrainConfig


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to lr over warmup_steps, then cosine decay to min_lr at the last step.

    ``step`` counts the updates made before this one (0 to steps - 1), so the last update,
    step = steps - 1, is the one made at min_lr.
    """
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - 1 - cfg.warmup_steps)
    floor = cfg.min_lr / cfg.lr
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def build_optimizer(model: GPT, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on the hidden matrices only: never on norms, biases or embeddings,
    nor anywhere under a placement that fixes the weights' norms (nGPT).

    Under ``model.param=mup`` the hidden matrices' LR is train.lr / m (μP for Adam; the group's
    ``lr_mult``) and their weight decay m x train.weight_decay, so the decay per step, lr x wd, is
    the base width's (microsoft/mup's MuAdam); the rest keep train.lr. The schedule scales every
    group's LR by the same factor.
    """
    hidden = {id(p) for p in hidden_weights(model)}
    weight_decay = cfg.weight_decay if model.hooks.weight_decay else 0.0
    params = list(model.parameters())
    decay = [p for p in params if id(p) in hidden]
    no_decay = [p for p in params if id(p) not in hidden]
    if model.cfg.param == "sp":
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    else:  # the multiplier-1 group first: group 0's LR is the schedule's own, the one the log reports
        m = model.cfg.width_mult()
        groups = [
            {"params": no_decay, "weight_decay": 0.0, "lr_mult": 1.0},
            {"params": decay, "weight_decay": weight_decay * m, "lr_mult": 1.0 / m, "lr": cfg.lr / m},
        ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=device.type == "cuda")

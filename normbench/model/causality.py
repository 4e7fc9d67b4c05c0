"""The causality probe: does a position's output depend on tokens after it?

Perturb every token after position t and measure the largest change in the logits
at positions 0..t. A causal LM gives exactly 0 up to float noise. BatchNorm in train
mode does not: its batch statistics pool future tokens and other sequences.
"""

from __future__ import annotations

import torch
from torch import nn

from normbench.model.gpt import leaves_no_trace


@torch.no_grad()
def causal_leak(model: nn.Module, tokens: torch.Tensor, vocab_size: int, train_mode: bool) -> float:
    """Max |logit change| at positions <= t when tokens after t = T // 2 are replaced."""
    t = tokens.shape[1] // 2
    # A fixed perturbation: the probe measures the model, never the caller's RNG state, and every
    # data-parallel rank perturbs alike (a synchronized BatchNorm pools all ranks' probe batches).
    shift = torch.randint(
        vocab_size - 1, tokens[:, t + 1 :].shape, generator=torch.Generator().manual_seed(0)
    )
    perturbed = tokens.clone()
    perturbed[:, t + 1 :] = (tokens[:, t + 1 :] + 1 + shift.to(tokens.device)) % vocab_size
    was_training = model.training
    model.train(train_mode)
    try:
        outputs = []
        with leaves_no_trace(model):  # BatchNorm's train-mode running-stat updates are undone
            for batch in (tokens, perturbed):
                torch.manual_seed(0)  # the same dropout masks for both passes
                outputs.append(model(batch)[0][:, : t + 1].float())
        return float((outputs[0] - outputs[1]).abs().max())
    finally:
        model.train(was_training)

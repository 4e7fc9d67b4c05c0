"""Training diagnostics: per-layer gradient, weight and update norms, residual RMS and variance, norm gains,
attention logits and entropy, the output logits' log-partition, and how saturated the point-wise
norms (DyT, Derf) are.

On a statistics step (step 0, then every ``train.stats_every`` steps) the training
loop calls ``begin()`` before the forward pass, ``after_backward()`` once the
gradients exist (before clipping and the update), and ``after_update()`` after the
optimizer step; ``record()`` then reads every number back in one host transfer.
Nothing here changes the training: it reads parameters, gradients and activations.

At the end of a run with statistics on, ``layer_skip_losses`` evaluates the model once per block
with that block skipped (its output replaced by its input): how much each layer contributes
(Sun et al. 2025, "The Curse of Depth": Pre-LN's deep layers barely matter).

Step labels follow Xiong et al. 2020: the record for step s holds the gradients at
the parameters after s updates, so step 0 is the first batch at initialization.

The logits are the two instabilities of Wortsman et al. 2023: attention logits that
grow until attention is one-hot (``max_attn_logit``, fixed by QK-norm) and output
logits that drift (``max_log_z``, fixed by z-loss). Under soft-capping (model.attn_softcap,
model.logit_softcap) these are what the softmax sees, after the cap, and ``*_raw`` beside them
the values before it; without a cap the two are the same and only the first is written. SDPA never
materializes the attention logits, so a statistics step computes them once more from the layer's own
q and k (``CausalSelfAttention.heads``): one extra q·kᵀ per layer, on that step only, and on the first
``STATS_SEQUENCES`` sequences of the batch, as are the output logits' statistics: the B·H·T² attention
logits and the B·T·V logits in float32 of a whole batch would take more memory than the step itself.
With micro-batches (train.micro_batch_size) the activations are read on the first one; the gradient,
weight and update norms are always the whole batch's. A compiled step never calls the hooks: there the
loop runs the first micro-batch once more, eagerly and without gradients, for them to read.
"""

from __future__ import annotations

import math
import statistics

import torch
from torch import nn

from normbench.model.gpt import DepthScaled
from normbench.model.layers import softcap

STATS_SEQUENCES = 8  # the sequences the attention and output logits' statistics are read on

# The sub-layer parts every block has, by the key used in metrics.jsonl.
PARTS = {"attn_in": "attn.qkv", "attn_out": "attn.proj", "mlp_in": "mlp.fc", "mlp_out": "mlp.proj"}


def _norm_of(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """The L2 norm of several tensors taken together (one vector), on their device."""
    if not tensors:
        return None
    return torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(t.detach().float()) for t in tensors])
    )


def global_grad_norm(params) -> torch.Tensor:
    """What clip_grad_norm_ would return, for when clipping is off."""
    return _norm_of([p.grad for p in params if p.grad is not None])


def _norm_modules(module: nn.Module) -> dict[str, nn.Module]:
    """A block's norms: its direct children named norm_* (the placements' convention), QK-norm's and V's."""
    # model.ln_scaling wraps each norm (DepthScaled): its gain and saturation are the wrapped norm's
    norms = {
        name: child.norm if isinstance(child, DepthScaled) else child
        for name, child in module.named_children()
        if name.startswith("norm")
    }
    attn = getattr(module, "attn", None)
    if getattr(attn, "qk_norm", False):
        norms.update(q_norm=attn.q_norm, k_norm=attn.k_norm)
    if getattr(attn, "v_norm", None) is not None:
        norms["v_norm"] = attn.v_norm
    return norms


def attention_logits(
    q: torch.Tensor, k: torch.Tensor, cap: float = 0.0, scale: float | None = None
) -> torch.Tensor:
    """The logits SDPA would softmax, q·kᵀ · scale in float32 (scale None: 1/sqrt(head_dim); μP's 1/head_dim
    comes as the attention's ``scale``), the future at -inf; soft-capped, cap * tanh(logits / cap), where
    ``cap`` > 0."""
    T = q.shape[-2]
    logits = (q.float() @ k.float().transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if cap > 0:
        logits = softcap(logits, cap)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return logits.masked_fill(future, float("-inf"))


def attention_stats(
    q: torch.Tensor, k: torch.Tensor, cap: float = 0.0, scale: float | None = None
) -> tuple[torch.Tensor, ...]:
    """(largest attention logit, mean entropy in nats of each query's attention distribution, and
    under a cap the largest logit before it, else None)."""
    raw = attention_logits(q, k, scale=scale)  # one q·kᵀ; the cap, where on, applied to it
    logits = softcap(raw, cap).masked_fill(raw == float("-inf"), float("-inf")) if cap > 0 else raw
    entropy = torch.special.entr(logits.softmax(-1)).sum(-1).mean()
    return logits.amax(), entropy, raw.amax() if cap > 0 else None


def output_logit_stats(logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """log Z = logsumexp of each token's output logits (mean and max), and the largest logit."""
    log_z = logits.detach().float().logsumexp(-1)
    return {
        "mean_log_z": log_z.mean(),
        "max_log_z": log_z.max(),
        "max_output_logit": logits.detach().amax().float(),
    }


# A point-wise norm (DyT, Derf) counts an input as saturated where |its squashing function's argument|
# exceeds this: tanh(2) = 0.964 and erf(2) = 0.995, so the output barely moves with the input there
# (docs/diagnostics.md#saturation-of-the-point-wise-norms).
SATURATION = 2.0


def saturated_fraction(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The fraction of the elements of x whose argument(x) (alpha x, Derf's alpha x + s) is beyond
    SATURATION."""
    return (norm.argument(x.detach().float()).abs() > SATURATION).float().mean()


# The run-level peaks summary.json carries: the largest value any statistics step saw.
PEAKS = ("max_attn_logit", "max_log_z")
# Each peak's value before the soft-cap (model.attn_softcap, model.logit_softcap), carried where that cap is
# on.
RAW_PEAKS = {"max_attn_logit": "max_attn_logit_raw", "max_log_z": "max_log_z_raw"}


SPIKE_WINDOW = 20  # steps: the running median a gradient spike is measured against


def grad_spike(norms: list[float], window: int = SPIKE_WINDOW) -> float | None:
    """The largest ratio of a step's gradient norm to the median of the ``window`` steps before it
    (finite steps only): a spike relative to the run's own scale, which differs by orders of magnitude
    between placements (a post-norm stream's gradients are not a pre-norm one's). None before a window."""
    finite = [g for g in norms if math.isfinite(g)]
    ratios = [
        g / median
        for i, g in enumerate(finite[window:], window)
        if (median := statistics.median(finite[i - window : i])) > 0
    ]
    return max(ratios) if ratios else None


def _largest(values) -> float | None:
    """The largest of the layers' values; NaN if any is NaN (a diverging run), whatever its order; None if
    none."""
    values = [v for v in values if v is not None]
    return (math.nan if any(map(math.isnan, values)) else max(values)) if values else None


def _gain(norm: nn.Module) -> torch.Tensor | None:
    weight = getattr(norm, "weight", None)
    return weight if isinstance(weight, torch.Tensor) else None


class LayerStats:
    """Collects the per-layer statistics of one step for a model built by normbench.model.gpt.GPT."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.groups: dict[str, list[nn.Parameter]] = {}  # "blocks.3.mlp_out" -> params
        for i, block in enumerate(model.blocks):
            for key, path in PARTS.items():
                self.groups[f"{i}.{key}"] = list(block.get_submodule(path).parameters())
            self.groups[f"{i}.norm"] = [p for n in _norm_modules(block).values() for p in n.parameters()]
        self.groups["embedding.tok"] = [model.tok_emb.weight]
        if model.pos_emb is not None:  # model.arch=llama has none (rotary embeddings)
            self.groups["embedding.pos"] = [model.pos_emb.weight]
        self.groups["final_norm"] = list(model.norm_final.parameters())
        self._resid: list[torch.Tensor | None] = [None] * len(model.blocks)
        self._resid_var: list[torch.Tensor | None] = [None] * len(model.blocks)
        self._attn: list[tuple[torch.Tensor, ...] | None] = [None] * len(model.blocks)
        self._head: dict[str, torch.Tensor] = {}
        capped = {"max_attn_logit": model.cfg.attn_softcap > 0, "max_log_z": model.cfg.logit_softcap > 0}
        self.peaks: dict[str, float | None] = dict.fromkeys(
            [*PEAKS, *(RAW_PEAKS[k] for k in PEAKS if capped[k])]
        )
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []
        self._values: dict[str, torch.Tensor | None] = {}
        self._before: dict[str, list[torch.Tensor]] = {}
        self._gains: dict[str, torch.Tensor] = {}
        self._saturation: dict[str, torch.Tensor] = {}  # "3.norm_attn" or "final_norm" -> fraction
        # The point-wise norms (they have an ``argument``), by those keys.
        self._pointwise = {
            f"{i}.{name}": norm
            for i, block in enumerate(model.blocks)
            for name, norm in _norm_modules(block).items()
            if hasattr(norm, "argument")
        }
        if hasattr(model.norm_final, "argument"):
            self._pointwise["final_norm"] = model.norm_final

    def _saturation_hook(self, key: str):
        @torch.no_grad()
        def store(module, inputs, output):
            self._saturation[key] = saturated_fraction(module, inputs[0])

        return store

    def _hook(self, index: int):
        def store(module, inputs, output):
            out = output.detach().float()
            # RMS over everything; the variance over each token's channels, averaged over the tokens
            # (the residual-stream variance of Sun et al. 2025, which grows with depth under Pre-LN)
            self._resid[index] = out.pow(2).mean().sqrt()
            self._resid_var[index] = out.var(-1, unbiased=False).mean()

        return store

    def _attn_hook(self, index: int):
        @torch.no_grad()
        def store(module, inputs, output):
            q, k, _ = module.heads(inputs[0][:STATS_SEQUENCES])
            self._attn[index] = attention_stats(q, k, module.softcap, module.scale)

        return store

    def _head_hook(self, module, inputs, output):
        output = output[:STATS_SEQUENCES]
        # The logits the loss sees: times μP's output multiplier, capped where model.logit_softcap > 0.
        if self.model.readout_mult is not None:
            output = output * self.model.readout_mult
        cap = self.model.cfg.logit_softcap
        self._head = output_logit_stats(softcap(output, cap) if cap > 0 else output)
        if cap > 0:
            raw = output_logit_stats(output)
            self._head.update(max_log_z_raw=raw["max_log_z"], max_output_logit_raw=raw["max_output_logit"])

    def begin(self) -> None:
        # Hooked only for this one forward: on the other steps the blocks run hook-free,
        # so the statistics cost nothing per step however many blocks there are.
        self._hooks = [
            block.register_forward_hook(self._hook(i)) for i, block in enumerate(self.model.blocks)
        ]
        self._hooks += [
            block.attn.register_forward_hook(self._attn_hook(i)) for i, block in enumerate(self.model.blocks)
        ]
        # The logits as the loss sees them: the head's, scaled where the placement scales them (nGPT's s_z).
        self._hooks.append(self.model.hooks.register_forward_hook(self._head_hook))
        self._hooks += [
            norm.register_forward_hook(self._saturation_hook(key)) for key, norm in self._pointwise.items()
        ]
        self._values = {}
        self._saturation = {}

    def end_forward(self) -> None:
        """No more activations to read this step (the later micro-batches' forwards run hook-free)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def after_backward(self) -> None:
        self.end_forward()
        for key, params in self.groups.items():
            self._values[f"grad_norm.{key}"] = _norm_of([p.grad for p in params if p.grad is not None])
            self._values[f"weight_norm.{key}"] = _norm_of(params)
            self._before[key] = [p.detach().clone() for p in params]
        # Gains as they were when the gradients were taken, like the weight norms.
        self._gains = {}
        for i, block in enumerate(self.model.blocks):
            for name, norm in _norm_modules(block).items():
                if (g := _gain(norm)) is not None:
                    self._gains[f"{i}.{name}"] = g.detach().float().clone()
        if (g := _gain(self.model.norm_final)) is not None:
            self._gains["final_norm"] = g.detach().float().clone()

    @torch.no_grad()
    def after_update(self) -> None:
        for key, params in self.groups.items():
            update = _norm_of([p - old for p, old in zip(params, self._before[key])])
            weight = self._values[f"weight_norm.{key}"]
            self._values[f"update_ratio.{key}"] = None if update is None else update / weight.clamp_min(1e-12)
        self._before = {}

    def record(self, step: int, grad_norm: torch.Tensor, grad_clip: float) -> dict:
        """The JSON record for this step; the one host sync of the statistics."""
        flat = self._read(grad_norm)
        layers = [self._layer(flat, i, block) for i, block in enumerate(self.model.blocks)]
        extra = {}
        for group in ("embedding.tok", "embedding.pos", "final_norm"):
            extra[group.replace(".", "_")] = {
                kind: flat.get(f"{kind}.{group}") for kind in ("grad_norm", "weight_norm", "update_ratio")
            }
        if "gain.final_norm.mean" in flat:
            extra["final_norm"]["gain"] = {s: flat[f"gain.final_norm.{s}"] for s in ("mean", "min", "max")}
        if "saturation.final_norm" in flat:
            extra["final_norm"]["saturation"] = flat["saturation.final_norm"]
        total = flat["grad_norm"]
        logits = self._logits(flat, layers)
        return {
            "kind": "stats",
            "step": step,
            "grad_norm": total,
            "clipped": bool(grad_clip > 0 and total > grad_clip),
            **logits,
            "layers": layers,
            **extra,
        }

    def _read(self, grad_norm: torch.Tensor) -> dict[str, float]:
        """Every statistic of the step by its flat name, read back from the device in one transfer."""
        names, tensors = [], []
        attn = [
            (f"{kind}.{i}", value)
            for i, pair in enumerate(self._attn)
            if pair
            for kind, value in zip(("attn_max", "attn_entropy", "attn_max_raw"), pair)
        ]
        for name, value in [
            *self._values.items(),
            *((f"resid.{i}", r) for i, r in enumerate(self._resid)),
            *((f"resid_var.{i}", v) for i, v in enumerate(self._resid_var)),
            *attn,
            *self._head.items(),
            *((f"saturation.{k}", v) for k, v in self._saturation.items()),
            ("grad_norm", grad_norm),
        ]:
            if value is not None:
                names.append(name)
                tensors.append(value.reshape(()))
        for name, g in self._gains.items():
            names += [f"gain.{name}.mean", f"gain.{name}.min", f"gain.{name}.max"]
            tensors += [g.mean(), g.min(), g.max()]
        return dict(zip(names, torch.stack(tensors).tolist()))

    @staticmethod
    def _layer(flat: dict[str, float], i: int, block: nn.Module) -> dict:
        """Block ``i``'s part of the record."""

        def part(kind: str) -> dict:
            return {k: flat.get(f"{kind}.{i}.{k}") for k in [*PARTS, "norm"]}

        saturation = {
            name: flat[f"saturation.{i}.{name}"]
            for name in _norm_modules(block)
            if f"saturation.{i}.{name}" in flat
        }
        return {
            "grad_norm": part("grad_norm"),
            "weight_norm": part("weight_norm"),
            "update_ratio": part("update_ratio"),
            "resid_rms": flat.get(f"resid.{i}"),
            "resid_var": flat.get(f"resid_var.{i}"),
            "max_attn_logit": flat.get(f"attn_max.{i}"),
            **({"max_attn_logit_raw": flat[f"attn_max_raw.{i}"]} if f"attn_max_raw.{i}" in flat else {}),
            "attn_entropy": flat.get(f"attn_entropy.{i}"),
            "gain": {
                name: {s: flat[f"gain.{i}.{name}.{s}"] for s in ("mean", "min", "max")}
                for name in _norm_modules(block)
                if f"gain.{i}.{name}.mean" in flat
            },
            **({"saturation": saturation} if saturation else {}),  # point-wise norms only
        }

    def _logits(self, flat: dict[str, float], layers: list[dict]) -> dict:
        """The step's attention and output logit figures, the run's peaks (``peaks``) raised to them."""
        logits = {
            "max_attn_logit": _largest(layer["max_attn_logit"] for layer in layers),
            **(
                {"max_attn_logit_raw": _largest(layer.get("max_attn_logit_raw") for layer in layers)}
                if "max_attn_logit_raw" in self.peaks
                else {}
            ),
            **{
                key: flat.get(key)
                for key in (
                    "mean_log_z",
                    "max_log_z",
                    "max_output_logit",
                    "max_log_z_raw",
                    "max_output_logit_raw",
                )
                if key in flat or not key.endswith("_raw")
            },
        }
        for key in self.peaks:
            if logits[key] is not None and math.isfinite(logits[key]):
                self.peaks[key] = (
                    logits[key] if self.peaks[key] is None else max(self.peaks[key], logits[key])
                )
        return logits


@torch.no_grad()
def layer_skip_losses(model: nn.Module, evaluate, layers) -> dict[int, float]:
    """The validation loss with each block of ``layers`` (indices) skipped in turn, its output replaced by
    its input.

    ``evaluate()`` returns the validation loss of ``model`` as it is (the training loop's). A
    forward hook that returns the block's input makes the block the identity for that one
    evaluation; the loss rise over the full model's is what the layer contributes.
    """
    losses = {}
    for i in layers:
        handle = model.blocks[i].register_forward_hook(lambda module, inputs, output: inputs[0])
        try:
            losses[i] = evaluate()
        finally:
            handle.remove()
    return losses

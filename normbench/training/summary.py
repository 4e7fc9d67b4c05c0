"""The end of a run: the causality probe, summary.json and what is kept with it.

summary.json holds the run's results, speed, memory, diagnostics, the causality probe, the
environment and the provenance of its figures; ``save_result`` writes it after the final weights
and the trackers' summaries; an interrupted run ends with its checkpoint instead (``interrupted``).
Every function reads a training loop's ``Loop`` and its ``Run`` (normbench.training.loop, which
calls them, so they are typed loosely here); a batched group writes each seed's summary through them
too (normbench.training.batched).
"""

from __future__ import annotations

import functools
import math

from normbench.core import provenance
from normbench.core.devices import PRECISIONS
from normbench.core.errors import DiskFull
from normbench.model import impls
from normbench.training import checkpoint, distributed
from normbench.training.diagnostics import PEAKS, grad_spike, layer_skip_losses
from normbench.training.perf import flops_per_token, peak_flops
from normbench.training.preemption import StopSignals

LEAK_TOLERANCE = 1e-4  # float noise of two forward passes is ~1e-6; a real leak is orders larger


def bits_per_byte(loss: float, bytes_per_token: float | None) -> float | None:
    """Nats per token to bits per byte: loss / ln 2 / (bytes per token); None without bytes."""
    if bytes_per_token is None or not math.isfinite(loss):
        return None
    return loss / math.log(2) / bytes_per_token


def run_summary(loop, status: str, error: str | None, step: int, leak: dict) -> dict:
    """summary.json's content: results, speed, memory, diagnostics, the causality probe and the
    provenance (what the figures were measured with, the one block that says so)."""
    state, tcfg = loop.state, loop.tcfg
    finite_vals = [v for v in loop.val_losses if math.isfinite(v)]
    finite_norms = [g for g in loop.grad_norms if math.isfinite(g)]
    speed = loop.timer.summary(loop.tokens_per_step)
    model_flops = flops_per_token(state.model)
    wall_s = loop.wall_s()  # read once: the wall time and the wall-clock throughput agree
    mfu = peak = peak_source = None
    if speed["tokens_per_s"]:
        peak, peak_source = peak_flops(state.device, PRECISIONS[tcfg.precision], tcfg.peak_flops, tcfg.tf32)
        # tokens_per_s counts the global batch, which every rank's device shares.
        mfu = model_flops * speed["tokens_per_s"] / (peak * distributed.world_size())
    grad_norms = loop.grad_norms
    bytes_per_token = state.data.bytes_per_token
    return {
        "status": status,
        "error": error,
        "final_val_loss": loop.val_losses[-1] if status == "completed" else None,
        "best_val_loss": min(finite_vals) if finite_vals else None,
        # Bits per byte: comparable across tokenizers (null for the synthetic corpus, which has no bytes).
        "final_val_bpb": bits_per_byte(loop.val_losses[-1], bytes_per_token)
        if status == "completed"
        else None,
        "best_val_bpb": bits_per_byte(min(finite_vals), bytes_per_token) if finite_vals else None,
        "bytes_per_token": bytes_per_token,
        "floor_loss": state.data.floor_loss,
        **speed,
        **state.memory.summary(),  # peak_mem_mb: this run's peak; peak_mem_kind says what it measures
        "mfu": mfu,
        "flops_per_token": model_flops,
        "peak_flops": peak,  # per device
        "peak_flops_source": peak_source,
        "max_grad_norm": max(finite_norms) if finite_norms else None,
        "max_grad_spike": grad_spike(grad_norms),
        **(
            loop.stats.peaks if loop.stats else dict.fromkeys(PEAKS)
        ),  # max_attn_logit, max_log_z over the statistics steps
        "clip_fraction": (sum(g > tcfg.grad_clip for g in grad_norms) / len(grad_norms))
        if grad_norms and tcfg.grad_clip > 0
        else 0.0,
        "wall_s": wall_s,
        # tokens trained over the run's wall time, set-up, evals, statistics and checkpoints included
        # (tokens_per_s is the steps' alone): what a run of this length delivers
        "wall_tokens_per_s": step * loop.tokens_per_step / wall_s if step else None,
        "resumed_at": loop.resumed_at,
        "steps": step,
        "params": state.model.num_params(),
        "vocab_size": state.data.vocab_size,
        "embedding_size": state.data.embedding_size,  # the vocabulary padded (token shards)
        "world_size": distributed.world_size(),
        "sync_batchnorm": distributed.batchnorm_sync(state.model),
        "causal_leak": leak,
        "leaks_future": bool(leak["train"] is not None and leak["train"] > LEAK_TOLERANCE),
        "compiled": state.compiled,
        "config_hash": state.cfg.config_hash,
        # the init and head the model had, and its placement's own (they differ where a run set them)
        "recipe": recipe(state.cfg),
        "provenance": run_provenance(state),
    }


def recipe(run) -> dict:
    """model.init and model.tie_head, and whether they are the placement's own (conf/placement/*.yaml)."""
    model, placement = run.model, run.placement
    own = {"init": placement.get("init", "gpt2"), "tie_head": placement.get("tie_head", True)}
    return {"init": model.init, "tie_head": model.tie_head, "placement_own": own}


def run_provenance(state) -> dict:
    """What this run's figures were measured with (normbench.core.provenance): under a compiled model
    inductor fuses every built-in norm's math itself."""
    compiled = state.compiled
    state_of_compile = (
        "on" if compiled else "off" if state.compile_error is None else f"fell back: {state.compile_error}"
    )
    norm_impl = {
        kind: impls.COMPILED if compiled and kind in impls.TABLE else how
        for kind, how in state.norm_impl.items()
    }
    return provenance.collect(state.device, state.tcfg.precision, norm_impl, state_of_compile)


# train.end_checks=auto: the end-of-run checks take at most this share of the run's wall time so far,
# or this many seconds, whichever is more (a short run's checks cost seconds: all of them run)
END_CHECKS_SHARE, END_CHECKS_FREE_S = 0.03, 10.0


def skipped_layers(loop) -> list[int]:
    """The blocks whose skip-one-layer eval runs at the end (train.end_checks): every one, none, or under
    auto those that fit in the budget, evenly spread over the depth (none if not even one fits)."""
    n_layer = len(loop.state.model.blocks)
    if loop.tcfg.end_checks is False:
        return []
    if loop.tcfg.end_checks == "auto":
        eval_s = loop.phases.seconds.get("eval", 0.0) / max(len(loop.val_losses), 1)
        budget = max(END_CHECKS_SHARE * loop.wall_s(), END_CHECKS_FREE_S)
        fits = n_layer if eval_s <= 0 else min(n_layer, int(budget / eval_s))
        if fits < n_layer:
            return sorted({round(i * (n_layer - 1) / max(fits - 1, 1)) for i in range(fits)})
    return list(range(n_layer))


def end_checks(loop, status: str) -> tuple[dict, list | None, dict]:
    """The causality probe and each layer's contribution (train.end_checks): (the probe's leaks, the
    skip-one-layer losses (None for a layer not evaluated), what ran: the summary's ``end_checks``)."""
    state, setting = loop.state, loop.tcfg.end_checks
    layers = skipped_layers(loop) if loop.stats and status == "completed" else []
    with loop.phases("probe"):
        # four sequences, four forwards: under auto it always fits
        probed = status != "failed" and setting is not False
        leak = state.probe() if probed else {"train": None, "eval": None}
        # each layer's contribution (docs/diagnostics.md), with the other statistics; through the eager
        # model, which the skipping hook changes
        skip = None
        if layers:
            losses = layer_skip_losses(state.model, functools.partial(state.evaluate, compiled=False), layers)
            skip = [losses.get(i) for i in range(len(state.model.blocks))]
    return leak, skip, {"setting": setting, "probe": probed, "skipped_layers": layers}


def finish(loop, status: str, error: str | None, step: int) -> dict:
    """The end-of-run checks, then the summary, saved."""
    leak, skip, checks = end_checks(loop, status)
    with loop.phases("finish"):
        summary = run_summary(loop, status, error, step, leak)
        summary["layer_skip_loss"] = skip
        summary["end_checks"] = checks
    return save_result(loop, summary)


def save_result(loop, summary: dict) -> dict:
    """The final weights, the trackers' summaries, then summary.json: the run is a result from here.
    A full disk on the way leaves the run resumable from its last checkpoint."""
    state, tcfg = loop.state, loop.tcfg
    if loop.main:
        try:
            if tcfg.save_model and summary["status"] != "failed":
                checkpoint.save_weights(state.dir.path, state.model)
            with loop.phases("finish"):
                # before summary.json, which MLflow copies; a tracker that fails is a warning, never the run
                summary = loop.sinks.finish(summary)
            summary["time_s"] = loop.phases.seconds
            state.dir.write_summary(summary)
        except DiskFull as err:
            err.resume_step = loop.saved_step
            raise
        loop.checkpoints.remove()  # the summary is the result now
    else:
        summary["time_s"] = loop.phases.seconds
    return summary


def interrupted(loop, stop: StopSignals, step: int, pass_on: bool = True) -> dict:
    """Stopped by a signal after its checkpoint: end the trackers' runs and pass the signal on (the
    last of a batched group's seeds passes it: ``pass_on``)."""
    loop.sinks.abort()  # the trackers' runs end as killed; a resumed run starts new ones
    try:
        if pass_on:
            stop.pass_on()  # under submitit: its checkpoint-and-requeue, which exits
    except Exception as err:  # submitit declining to requeue (timed out too often): still a resumable run
        loop.console.print(f"[yellow]not requeued[/yellow]: {err}", highlight=False)
    return {
        "status": "interrupted",
        "steps": step,
        "signal": stop.received,
        # where a resume starts: ``steps`` unless its checkpoint failed (``checkpoint_failure`` says why)
        "saved_step": loop.saved_step,
        "checkpoint_failure": loop.checkpoints.failure if loop.checkpoints is not None else None,
    }

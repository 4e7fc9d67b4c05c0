"""Seeds as one batched model: K runs of one config that differ only in ``seed``, trained together.

On a CPU a small model's step is mostly Python and dispatch overhead, so K seeds trained one after
another pay it K times. ``train_batched`` builds every seed exactly as ``train`` builds it (the same
``Run``: data, initialisation and batch stream, so each seed starts bit-identical to its sequential
run), stacks their parameters (``torch.func.stack_module_state``) and trains one K-times-larger
problem: each step runs the model with ``torch.func.functional_call`` under ``torch.func.vmap`` over
the stacked parameters and the stacked batches, each seed's own (``BatchedOps`` writes the linear
layers and the causal attention in the forms vmap batches well).

What stays per seed: the batch stream and initialisation, dropout's draws (vmap's
``randomness="different"``), BatchNorm's statistics, AdamW's state (it is elementwise, so one AdamW
over the stacked tensors is K independent ones, with build_optimizer's decay groups), gradient
clipping by the seed's own global norm, evaluation, per-layer statistics, divergence (a seed that
diverges is recorded as diverged at its log step and stops; the others go on), and the run directory,
written by the training loop's own ``Loop`` and ``run_summary`` in a sequential run's format.
Provenance says ``batched: K``; ``train.batched`` is part of the config hash
(normbench.core.identity), since the batched arithmetic differs from a sequential run's in the last
bits.

Checkpoints are per seed and in a sequential run's format: the seed's weights, its slice of the
group's AdamW state, the schedule, its batch stream and the shared dropout RNG. A group resumes when
every seed's checkpoint is at one step, bit for bit as if never stopped; seeds at different steps
(a damaged checkpoint, a seed trained alone) start the group afresh.

``why_not`` says why a config cannot train batched (a user's norm or placement, nGPT's weight
renormalisation, torch.compile, fp16's gradient scaler, fused norm kernels). BatchNorm batches: its
running statistics are buffers, stacked per seed as the weights are, and updated per seed under vmap.
"""

from __future__ import annotations

import copy
import dataclasses
import time
import traceback
from pathlib import Path

import torch
from rich.console import Console
from torch.func import functional_call, stack_module_state, vmap
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from normbench.core.devices import resolve_device
from normbench.core.runs import CONFIG, RunDir
from normbench.model import impls, norms
from normbench.model.gpt import z_loss
from normbench.model.placements import ModelHooks, placement_class
from normbench.training import distributed
from normbench.training.diagnostics import LayerStats
from normbench.training.display import TrainProgress
from normbench.training.loop import Loop, Run
from normbench.training.optim import lr_factor
from normbench.training.perf import Phases, free_earlier_runs
from normbench.training.preemption import StopSignals
from normbench.training.summary import end_checks, interrupted, run_summary, save_result


def why_not(run) -> str | None:
    """Why the config of ``run`` (a RunConfig) cannot train batched, in a few words; None if it can."""
    # BatchNorm batches: its running statistics are buffers, stacked per seed like the weights.
    norm_cls = norms.norm_class(run.norm.get("name"), run.norm.get("_target_"))
    if not norm_cls.__module__.startswith("normbench."):
        return f"norm={run.norm.get('name')}: a user's norm, not known to run under torch.func.vmap"
    block_cls = placement_class(run.placement.get("name"), run.placement.get("_target_"))
    if not block_cls.__module__.startswith("normbench."):
        return f"placement={run.placement.get('name')}: a user's placement, not known to run under vmap"
    if block_cls.model_hooks.after_step is not ModelHooks.after_step:
        return f"placement={run.placement.get('name')}: weights rewritten after every step"
    if run.norm_impl == "fused":
        return "norm.impl=fused: the fused norm kernels have no vmap rule"
    # compile=cuda compiles where it pays: not here, where the step is vmapped
    if run.train.compile in (True, "auto"):
        return f"train.compile={run.train.compile}: vmap over a compiled model is not supported here"
    if run.train.micro_batch_size:
        return "train.micro_batch_size: the batched step takes the whole batch at once"
    if run.train.precision == "fp16":
        return "train.precision=fp16: its gradient scaler is one model's, not per seed"
    if distributed.launched():
        return "torchrun: one data-parallel run, not a group of seeds"
    return None


def check_group(runs: list) -> None:
    """Refuse (ValueError) runs that are not one config's seeds: batching is for seeds only."""
    seeds = [run.seed for run in runs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"batched seeds must differ, got {seeds}")

    def without_seed(run):
        return dataclasses.replace(run, seed=0, source=None, config_hash=None)

    if any(without_seed(run) != without_seed(runs[0]) for run in runs[1:]):
        raise ValueError("batched runs must differ in seed only")


class BatchedOps(TorchFunctionMode):
    """Two ops written for vmap's batching rules while the seeds' forward runs under it.

    ``F.linear`` on a (B, T, C) input with each seed's own weight: vmap's matmul rule broadcasts the
    weight over B and runs B x K small matrix products; flattened to (B*T, C), each seed's product is
    one (K-batch) matmul. ``F.scaled_dot_product_attention``: the fused CPU kernel has no batching
    rule (vmap would loop over the seeds), the math backend checks its masks row by row, and CUDA's
    fused kernels fail under vmap, so the causal softmax attention is written out in plain ops.
    Other calls pass through unchanged."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and args[0].dim() > 2:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            y = torch.matmul(x.reshape(-1, x.shape[-1]), weight.t())
            if bias is not None:
                y = y + bias
            return y.reshape(*x.shape[:-1], weight.shape[0])
        if func is F.scaled_dot_product_attention and _plain_causal(args, kwargs):
            q, k, v = args[:3]
            scale = kwargs.get("scale") or q.shape[-1] ** -0.5
            t = q.shape[-2]
            future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
            logits = torch.matmul(q, k.transpose(-2, -1)) * scale
            weights = logits.masked_fill(future, float("-inf")).softmax(-1)
            p = kwargs.get("dropout_p", 0.0)
            return torch.matmul(F.dropout(weights, p) if p else weights, v)
        return func(*args, **kwargs)


def _plain_causal(args, kwargs) -> bool:
    """Whether an SDPA call is the model's own: causal, no mask, no grouped heads."""
    return (
        len(args) == 3
        and kwargs.get("is_causal")
        and kwargs.get("attn_mask") is None
        and not kwargs.get("enable_gqa")
        and set(kwargs) <= {"is_causal", "dropout_p", "scale", "attn_mask", "enable_gqa"}
    )


class Group:
    """K seeds' parameters stacked along a new first dimension, with their optimizer and schedule."""

    def __init__(self, states: list[Run]):
        self.states = states
        self.k = len(states)
        models = [state.model for state in states]
        self.params, self.buffers = stack_module_state(models)
        # The module whose code runs every seed: its own tensors are never read (functional_call). A
        # copy, not meta tensors: moving to meta unties the head from the token embedding.
        self.base = copy.deepcopy(models[0])
        # build_optimizer's groups (decay or not, μP's LR multipliers), over the stacked tensors.
        name_of = {id(p): name for name, p in models[0].named_parameters()}
        groups = [
            {**{key: value for key, value in group.items() if key != "params"}}
            | {"params": [self.params[name_of[id(p)]] for p in group["params"]]}
            for group in states[0].optimizer.param_groups
        ]
        self.optimizer = torch.optim.AdamW(groups)
        tcfg = states[0].tcfg
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, tcfg))
        if states[0].optimizer.state:  # resumed: every seed's AdamW state and schedule, from its checkpoint
            self.optimizer.load_state_dict(stack_optimizer_states([s.optimizer.state_dict() for s in states]))
            self.scheduler.load_state_dict(states[0].scheduler.state_dict())
        self.tcfg = tcfg
        self.z_coef = tcfg.z_loss
        self.autocast = states[0].autocast  # bf16 as a sequential run's autocast, norm statistics in fp32

        def loss_of(params, buffers, x, y):
            with BatchedOps():
                logits, loss = functional_call(self.base, (params, buffers), (x, y))
            z = z_loss(logits) if self.z_coef else loss.new_zeros(())
            return loss, z

        self.losses = vmap(loss_of, randomness="different")

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One update of every seed; returns (losses, grad norms before clipping, z terms), each (K,)."""
        batches = [state.train_batch(state.batch_gen) for state in self.states]
        x = torch.stack([b[0] for b in batches])
        y = torch.stack([b[1] for b in batches])
        self.base.train()
        with self.autocast:
            loss, z = self.losses(self.params, self.buffers, x, y)
        z_term = self.z_coef * z
        (loss.sum() + z_term.sum() if self.z_coef else loss.sum()).backward()
        grad_norm = self.clip_per_seed()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return loss.detach(), grad_norm, z_term.detach()

    @torch.no_grad()
    def clip_per_seed(self) -> torch.Tensor:
        """Each seed's global gradient norm, (K,), and its gradients clipped by it as
        ``clip_grad_norm_`` clips one model's."""
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        per_tensor = torch.stack([torch.linalg.vector_norm(g.flatten(1), 2, dim=1) for g in grads], dim=1)
        norms_ = torch.linalg.vector_norm(per_tensor, 2, dim=1)
        if self.tcfg.grad_clip > 0:
            coef = (self.tcfg.grad_clip / (norms_ + 1e-6)).clamp(max=1.0)
            for g in grads:
                g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))
        return norms_

    @torch.no_grad()
    def evaluate(self) -> list[float]:
        """Every seed's validation loss, in eval mode, on its own validation batches."""
        self.base.eval()
        losses = []
        for i in range(len(self.states[0].val)):
            x = torch.stack([state.val[i][0] for state in self.states])
            y = torch.stack([state.val[i][1] for state in self.states])
            with self.autocast:
                losses.append(self.losses(self.params, self.buffers, x, y)[0].float())
        self.base.train()
        return torch.stack(losses).mean(0).tolist()

    def sync_into(self, k: int) -> None:
        """Seed ``k``'s weights, AdamW state and schedule into its own Run, for its checkpoint."""
        self.load_into(k)
        group = self.optimizer.state_dict()
        seed = {
            "param_groups": group["param_groups"],
            "state": {
                i: {key: value if key == "step" else value[k].clone() for key, value in tensors.items()}
                for i, tensors in group["state"].items()
            },
        }
        self.states[k].optimizer.load_state_dict(seed)
        self.states[k].scheduler.load_state_dict(self.scheduler.state_dict())

    @torch.no_grad()
    def load_into(self, k: int) -> None:
        """Seed ``k``'s current weights into its own model (for its probe, statistics and model.pt)."""
        model = self.states[k].model
        for name, p in model.named_parameters():
            p.copy_(self.params[name][k])
        for name, b in model.named_buffers():
            if name in self.buffers:
                b.copy_(self.buffers[name][k])


def stack_optimizer_states(seeds: list[dict]) -> dict:
    """One AdamW state dict over stacked parameters from each seed's own (their steps are one)."""
    first = seeds[0]
    return {
        "param_groups": first["param_groups"],
        "state": {
            i: {
                key: value if key == "step" else torch.stack([seed["state"][i][key] for seed in seeds])
                for key, value in tensors.items()
            }
            for i, tensors in first["state"].items()
        },
    }


class SeedStats:
    """Per-layer statistics of one seed on a statistics step: its own eager forward and backward on
    its own batch and weights (the batched step's gradients are the same up to float rounding)."""

    def __init__(self, group: Group, k: int, stats: LayerStats, x: torch.Tensor, y: torch.Tensor):
        self.group, self.k, self.stats = group, k, stats
        group.load_into(k)
        model = group.states[k].model
        stats.begin()
        with group.autocast:
            logits, loss = model(x, y)
        (loss + group.z_coef * z_loss(logits) if group.z_coef else loss).backward()
        stats.after_backward()
        model.zero_grad(set_to_none=True)

    def after_update(self, step: int, grad_norm: torch.Tensor, grad_clip: float) -> dict:
        self.group.load_into(self.k)
        self.stats.after_update()
        return self.stats.record(step, grad_norm, grad_clip)


def train_batched(runs: list, run_dirs: list[Path], console: Console | None = None) -> list[dict]:
    """Train ``runs`` (RunConfigs of one config, differing only in seed) as one batched model into
    ``run_dirs``; return each run's summary, as ``train`` returns one (and writes it)."""
    console = console or Console(stderr=True)
    check_group(runs)
    for run in runs:
        if reason := why_not(run):
            raise ValueError(f"cannot train seeds batched: {reason}")
    started, phases = time.perf_counter(), Phases()
    for run, run_dir in zip(runs, run_dirs):
        if run.source is not None and not (Path(run_dir) / CONFIG).exists():
            RunDir(run_dir).write_config(run.source)
    with phases("setup"):
        free_earlier_runs()
        states, loops = _seeds(runs, run_dirs, console, started)
        if len(starts := {loop.start for loop in loops}) > 1:
            steps = sorted(starts)
            console.print(
                f"[yellow]the seeds' checkpoints are at steps {steps}: the group starts afresh[/yellow]"
            )
            for loop in loops:  # their metrics and trackers are the discarded start's
                loop.sinks.abort()
                loop.checkpoints.remove()
            states, loops = _seeds(runs, run_dirs, console, started)
        group = Group(states)  # stacks each seed's weights and optimizer state, resumed or new
    # The group's time before a resume (every seed's checkpoint holds it), counted once, then shared.
    for phase, seconds in loops[0].phases.seconds.items():
        phases.seconds[phase] = phases.seconds.get(phase, 0.0) + seconds
    for loop in loops:
        loop.phases = phases
    return _train(group, loops, phases, console)


def _seeds(runs: list, run_dirs: list[Path], console: Console, started: float):
    """Each seed's Run and Loop; a Loop resumes its seed from its own checkpoint when there is one."""
    # Each Run seeds the global RNG with its own seed before it builds its model: each seed's
    # initialisation is its sequential run's, bit for bit.
    states = [Run(run, run_dir) for run, run_dir in zip(runs, run_dirs)]
    impls.use("eager")  # the fused norm kernels are C++ ops with no vmap rule
    device = resolve_device(runs[0].train.device)
    for state in states:
        state.norm_impl = norms.implementations(state.model, device)
    # the dropout RNG is the group's: every seed's checkpoint holds the same state, restored last
    return states, [Loop(state, console, started, Phases()) for state in states]


def _train(group: Group, loops: list[Loop], phases: Phases, console: Console) -> list[dict]:
    """The batched loop: ``train``'s cadences (log windows, evaluation, statistics) for every seed at
    once, each seed finishing on its own."""
    tcfg, k = group.tcfg, group.k
    summaries: list[dict | None] = [None] * k
    active = list(range(k))  # the seeds still training

    def finish(i: int, status: str, step: int, error: str | None = None) -> None:
        loop = loops[i]
        loop.sinks.close()
        group.load_into(i)
        leak, skip, checks = end_checks(loop, status)
        summary = run_summary(loop, status, error, step, leak)
        summary["layer_skip_loss"] = skip
        summary["end_checks"] = checks
        summary["provenance"]["batched"] = k
        # Each seed's share of the group's time: the sweep's account of its workers' time adds seeds up.
        loop.phases = Phases({phase: s / k for phase, s in phases.seconds.items()})
        summaries[i] = save_result(loop, summary)
        active.remove(i)

    def checkpoint(done: int, now: bool = False) -> None:
        for i in active:
            if now or loops[i].checkpoint_due(done):
                group.sync_into(i)
                loops[i].checkpoint(done, now=True)

    start = step = loops[0].start
    try:
        if start == 0:
            first = group.evaluate()
            for i in active:
                loops[i].record_eval(0, first[i])
        with (
            TrainProgress(console, tcfg.progress, tcfg.steps, start) as bar,
            StopSignals() as stop,
        ):
            for step in range(start + 1, tcfg.steps + 1):
                if stop.requested(step - 1, tcfg.log_every, loops[0].state.device):
                    checkpoint(step - 1, now=True)
                    stopped = {i: interrupted(loops[i], stop, step - 1, i == active[-1]) for i in active}
                    return [summaries[i] or stopped[i] for i in range(k)]
                checkpoint(step - 1)
                _step(group, loops, phases, active, step)
                logged = False
                if step % tcfg.log_every == 0 or step == tcfg.steps:
                    logged = True
                    with phases("logging"):
                        records = {i: loops[i].log_window(step) for i in list(active)}
                    bar.update(records[active[0]])
                    for i in [i for i in active if loops[i].diverged]:
                        finish(i, "diverged", step)
                if not active:
                    break
                if loops[active[0]].eval_due(step):
                    with phases("eval"):
                        values = group.evaluate()
                    for i in active:
                        loops[i].record_eval(step, values[i])
                if logged:
                    for i in active:
                        loops[i].sinks.flush()
    except KeyboardInterrupt:
        for i in active:
            loops[i].sinks.abort()
        raise
    except Exception as err:  # a crash fails every seed still training, recorded as failed runs
        for i in list(active):
            loops[i].state.dir.write_error(traceback.format_exc())
            finish(i, "failed", step, f"{type(err).__name__}: {err}")
    for i in list(active):
        finish(i, "completed", step)
    return summaries


def _step(group: Group, loops: list[Loop], phases: Phases, active: list[int], step: int) -> None:
    """Update ``step`` (1-based) of every seed, with per-layer statistics when they are due."""
    tcfg = group.tcfg
    collect = tcfg.stats_every and (step - 1) % tcfg.stats_every == 0
    lr = group.scheduler.get_last_lr()[0]
    seed_stats = {}
    with phases("steps"):
        if collect:
            # The batch the batched step draws next, drawn from copies of the streams.
            for i in active:
                state = loops[i].state
                gen = torch.Generator().set_state(state.batch_gen.get_state())
                seed_stats[i] = SeedStats(group, i, loops[i].stats, *state.train_batch(gen))
        loss, grad_norm, z_term = group.train_step()
    for i, seed in seed_stats.items():
        with phases("statistics"):
            loops[i].sinks.log(seed.after_update(step - 1, grad_norm[i], tcfg.grad_clip))
    for i in active:
        loop = loops[i]
        loop.lr = lr
        loop.pending.append((loss[i], grad_norm[i], z_term[i]) if tcfg.z_loss else (loss[i], grad_norm[i]))
        loop.timer.tick()

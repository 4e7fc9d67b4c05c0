"""The training loop: one run from typed configs to a finished run directory.

``train(run, run_dir)`` builds the dataset, model and optimizer, trains with a
warm-up + cosine schedule, evaluates in eval mode on fixed validation batches, stops
on divergence, probes causality and writes ``summary.json`` (the optimizer and its schedule:
normbench.training.optim; the summary: normbench.training.summary). Losses stay on the
device and are read back once per ``train.log_every`` steps, so logging costs one
host sync per window, not one per step. Under torchrun the same loop trains with
DDP (normbench.training.distributed); rank 0 alone writes the run directory.
"""

from __future__ import annotations

import functools
import math
import time
import traceback
from pathlib import Path

import torch
from rich.console import Console
from torch import nn

from normbench.core import provenance
from normbench.core.devices import PRECISIONS, resolve_device, synchronize
from normbench.core.errors import ConfigError, DiskFull, first_line
from normbench.core.identity import config_hash
from normbench.core.runs import CONFIG, RunDir
from normbench.data.corpus import build_dataset, forget_other_corpora, unigram_entropy
from normbench.model import impls, kernels, norms
from normbench.model.causality import causal_leak
from normbench.model.gpt import GPT, leaves_no_trace, z_loss
from normbench.training import checkpoint, distributed
from normbench.training.diagnostics import LayerStats, global_grad_norm
from normbench.training.display import TrainProgress, say_setup
from normbench.training.optim import build_optimizer, lr_factor
from normbench.training.perf import (
    PeakMemory,
    Phases,
    StepTimer,
    free_earlier_runs,
    peak_flops,
    remember_run,
)
from normbench.training.preemption import StopSignals
from normbench.training.sinks import MetricSinks
from normbench.training.summary import bits_per_byte, finish, interrupted

DEFAULT_THREADS = torch.get_num_threads()  # PyTorch's own choice for this process, before any run sets it


def compile_model(step_model: nn.Module, model: nn.Module, x: torch.Tensor, y: torch.Tensor, autocast):
    """torch.compile the training forward, compiled now on one batch so a failure falls back to eager.

    Returns (module to train with, None) or (the eager module, why compiling failed).
    The trial pass leaves no trace: gradients are dropped, BatchNorm's running statistics
    restored, and the RNG untouched.
    """
    try:
        compiled = torch.compile(step_model)
        with leaves_no_trace(model):
            with autocast:
                loss = compiled(x, y)[1]
            loss.backward()
        return compiled, None
    except Exception as err:  # no compiler, unsupported platform, an op inductor can't lower
        return step_model, first_line(err)
    finally:
        model.zero_grad(set_to_none=True)


def warm_up(threads: int) -> None:
    """Pay now what the first run in a process pays once: its optimizer imports torch._dynamo (over
    a second on a 2-core machine), MFU's matmul peak is measured (``peak_flops``), the commit read
    (``normbench.core.provenance``).
    A sweep's workers do this while the sweep is planned (``normbench.sweeps.job.warm_worker``)."""
    torch.set_num_threads(threads or DEFAULT_THREADS)
    torch.optim.AdamW([nn.Parameter(torch.zeros(1))])
    peak_flops(torch.device("cpu"), PRECISIONS["fp32"])
    provenance.git_state()


class Run:
    """Everything one run holds while it trains, built in the run's order: the devices, the data, the
    model, its wrapping (DDP, then torch.compile), the optimizer and the schedule."""

    def __init__(self, run, run_dir: Path):
        self.cfg, self.tcfg = run, run.train
        self.dir = RunDir(run_dir)
        self.device, self.autocast, self.memory = self.devices()
        self.data, self.batch_gen, self.val, self.threshold = self.build_data()
        self.model, self.norm_impl = self.build_model()
        self.step_model, self.eager_model, self.compile_error = self.wrap()
        # Evaluations' module: compiled where training is (its own graph: eval mode, no gradients), else
        # the model itself (no DDP: every rank evaluates the same batches, and no gradients to reduce).
        self.eval_model = torch.compile(self.model) if self.compiled else self.model
        self.optimizer = build_optimizer(self.model, self.tcfg, self.device)
        self.scheduler, self.scaler, self.updates = self.schedule()
        self.z_term: torch.Tensor | None = None  # the last step's z-loss term, when train.z_loss is on

    def devices(self) -> tuple[torch.device, torch.autocast, PeakMemory]:
        """This process's device, its settings for this run and the seed: (device, autocast, memory)."""
        run, tcfg = self.cfg, self.tcfg
        if distributed.is_main():
            self.dir.path.mkdir(parents=True, exist_ok=True)
        device = distributed.setup(resolve_device(tcfg.device))
        if not distributed.trains(True, device):  # rank 0 found a result, or refused, and said so
            raise SystemExit(0)
        distributed.local_batch_size(tcfg.batch_size)  # a batch that does not split evenly fails here
        if tcfg.precision == "fp16" and device.type != "cuda":
            raise ConfigError(
                "train.precision=fp16 needs a CUDA device (it trains with a gradient scaler)",
                allowed=["fp32", "bf16"],
            )
        # Set every run, both ways: a threads=0 run after a threads=N one in the same process
        # (the basic launcher, a reused joblib worker) gets PyTorch's default back, not N.
        torch.set_num_threads(tcfg.threads or DEFAULT_THREADS)
        # Set both ways every run: a launcher may run several runs in one process.
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tcfg.tf32
        impls.use(run.norm_impl)  # every run: one process may train several
        # an earlier run's corpus is not this run's memory
        forget_other_corpora(run.data, run.model.block_size)
        memory = PeakMemory(device)  # before the data and model exist
        # Each rank its own dropout stream; the initial weights are rank 0's alone (DDP copies them to every
        # rank).
        torch.manual_seed(run.seed + distributed.rank())
        autocast = torch.autocast(
            device.type, dtype=PRECISIONS[tcfg.precision], enabled=tcfg.precision != "fp32"
        )
        return device, autocast, memory

    def build_data(self) -> tuple:
        """(dataset, the training batch stream, the fixed validation batches on the device, the loss
        above which the run has diverged)."""
        run, tcfg = self.cfg, self.tcfg
        data = build_dataset(run.data, run.model.block_size, tcfg.eval_batches * tcfg.batch_size)
        batch_gen = torch.Generator().manual_seed(run.seed)
        val = [
            (x.to(self.device), y.to(self.device))
            for x, y in data.val_batches(tcfg.eval_batches, tcfg.batch_size)
        ]
        return data, batch_gen, val, tcfg.diverge_threshold or 3 * math.log(data.vocab_size)

    def build_model(self) -> tuple[GPT, dict[str, str]]:
        """The model on the device, and the implementation each of its norms runs."""
        run = self.cfg
        # The embedding has embedding_size rows: token shards' vocabularies padded to a multiple of 64.
        model = GPT(run.model, self.data.embedding_size, run.norm, run.placement).to(self.device)
        return model, norms.implementations(model, self.device)  # norm.impl=fused that can't: fails here

    def wrap(self) -> tuple[nn.Module, nn.Module, str | None]:
        """(the module each step trains: DDP under torchrun, compiled under train.compile; that module
        uncompiled, whose DDP skips the all-reduce on all micro-batches but the last; why compiling
        failed, or None)."""
        step_model = distributed.wrap(self.model, self.device)  # DDP under torchrun, else self.model
        eager_model, compile_error = step_model, None
        if self.tcfg.compiles_on(self.device):
            # Compiled on the first micro-batch the first step trains on (drawn from a copy of the
            # stream, which stays where it is): this rank's share, the shape every forward has, so
            # training never recompiles for a shape the trial alone had, and the trial needs no more
            # memory than a step.
            first = torch.Generator().set_state(self.batch_gen.get_state())
            step_model, compile_error = compile_model(
                step_model, self.model, *self.micro_batches(*self.train_batch(first))[0], self.autocast
            )
            if compile_error and self.tcfg.compile is True:
                raise ConfigError(
                    f"train.compile=true: torch.compile failed here ({compile_error})",
                    allowed=["train.compile=auto (falls back to eager, and says so)", "train.compile=false"],
                )
        return step_model, eager_model, compile_error

    @property
    def compiled(self) -> bool:
        """Whether the training step runs a compiled model."""
        return self.tcfg.compiles_on(self.device) and self.compile_error is None

    def schedule(self) -> tuple:
        """(the LR schedule, fp16's gradient scaler, the count of the optimizer's updates)."""
        tcfg = self.tcfg  # the schedule holds the config, not the run: no reference cycle keeps a run alive
        scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, tcfg))
        remember_run(self.model, self.optimizer)
        scaler = torch.amp.GradScaler(self.device.type, enabled=tcfg.precision == "fp16")
        # The optimizer's updates, counted by a hook: fp16's scaler skips an update whose gradients
        # overflowed, and such a step is no step of the schedule. (A list, not self: no reference cycle.)
        updates = [0]
        self.optimizer.register_step_post_hook(lambda *_: updates.__setitem__(0, updates[0] + 1))
        return scheduler, scaler, updates

    def train_batch(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's share of the next global training batch, on the device."""
        x, y = self.data.train_batch(self.tcfg.batch_size, generator)  # the global batch, on every rank
        x, y = distributed.shard(x), distributed.shard(y)
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def micro_batches(self, x: torch.Tensor, y: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's batch as the micro-batches of ``train.micro_batch_size`` (the batch itself without)."""
        size = self.tcfg.micro_batch_size or x.shape[0]
        if size == x.shape[0]:
            return [(x, y)]
        if x.shape[0] % size:
            raise ConfigError(
                f"train.micro_batch_size={size} must divide each device's share of train.batch_size "
                f"({x.shape[0]} sequences)"
            )
        return list(zip(x.split(size), y.split(size)))

    def train_step(self, stats: LayerStats | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One update; returns (loss, global grad norm before clipping), both still on the device.

        The batch's gradients are accumulated over its micro-batches, each loss weighted by its share of
        the batch: the sum is the gradient of the batch's mean loss. Under DDP they are all-reduced once,
        at the last micro-batch. On a statistics step the gradients are the whole batch's, the activations
        read on the first micro-batch (``LayerStats``)."""
        x, y = self.train_batch(self.batch_gen)
        micro = self.micro_batches(x, y)
        if stats:
            stats.begin()
            if self.compiled:
                # A compiled graph never calls the hooks, and an eager training step would hold eager's
                # activations, more than the compiled step's: a forward of their own reads them, without
                # gradients or a loss, on the parameters the step trains (dropout's draws and BatchNorm's
                # running statistics left as they were), and the step stays compiled.
                with torch.no_grad(), leaves_no_trace(self.model), self.autocast:
                    self.model(micro[0][0])
                stats.end_forward()
        losses, z_terms = [], []
        for i, (xm, ym) in enumerate(micro):
            with distributed.gradients_kept_local(self.eager_model, i < len(micro) - 1):
                with self.autocast:
                    logits, loss = self.step_model(xm, ym)
                if stats and i == 0:
                    stats.end_forward()
                # train_loss stays the cross-entropy; the z term is kept apart for its own log entry.
                z_term = self.tcfg.z_loss * z_loss(logits) if self.tcfg.z_loss else None
                total = loss if z_term is None else loss + z_term
                self.scaler.scale(total / len(micro) if len(micro) > 1 else total).backward()
            losses.append(loss.detach() if len(micro) > 1 else loss)  # no micro-step's graph kept
            if z_term is not None:
                z_terms.append(z_term.detach())
        loss = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
        self.z_term = None if not z_terms else torch.stack(z_terms).mean()
        self.scaler.unscale_(self.optimizer)  # true gradients for clipping and statistics
        if stats:
            stats.after_backward()
        params = self.model.parameters()
        if self.tcfg.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.tcfg.grad_clip)
        else:
            grad_norm = global_grad_norm(params)
        updates = self.updates[0]
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.model.after_step()
        if stats:
            stats.after_update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.updates[0] > updates:
            self.scheduler.step()
        return loss.detach(), grad_norm.detach()

    @torch.no_grad()
    def evaluate(self, compiled: bool = True) -> float:
        """Validation loss, always in eval mode (BatchNorm's running stats, no dropout), in micro-batches
        of ``train.micro_batch_size``; through the compiled model where there is one, unless not
        ``compiled`` (a forward hook changes the model: normbench.training.diagnostics.layer_skip_losses)."""
        model = self.eval_model if compiled else self.model
        self.model.eval()
        losses = []
        for x, y in self.val:
            for xm, ym in self.micro_batches(x, y):
                with self.autocast:
                    losses.append(model(xm, ym)[1].float())
        self.model.train()
        return float(torch.stack(losses).mean())

    def probe(self) -> dict:
        tokens = self.val[0][0][:4]
        return {
            mode: causal_leak(self.model, tokens, self.data.vocab_size, mode == "train")
            for mode in ("train", "eval")
        }


def say_warning(console: Console, message: str) -> None:
    console.print(f"[yellow]warning:[/yellow] {message}", soft_wrap=True, highlight=False)


class Loop:
    """Where training stands besides the model and optimizer, and the cadence of each component.

    Each component's method decides for itself whether this step is its turn: the
    statistics (``train.stats_every``), the log window (``train.log_every``: the one host
    sync), evaluation (``train.eval_every`` and the last step) and checkpoints
    (``train.checkpoint_every``). A checkpoint keeps this object's history, so a resumed
    run's summary covers the whole run.
    """

    def __init__(self, state: Run, console: Console, started: float, phases: Phases):
        self.state, self.tcfg, self.console = state, state.tcfg, console
        self.started = started  # this process's start of the run, set-up included
        self.phases = phases
        self.main = distributed.is_main()
        self.stats = LayerStats(state.model) if self.tcfg.stats_every else None
        self.timer = StepTimer(
            warmup_steps=min(self.tcfg.log_every, self.tcfg.steps // 5),
            sync=functools.partial(synchronize, state.device),
        )
        self.tokens_per_step = self.tcfg.batch_size * state.cfg.model.block_size
        self.val_losses: list[float] = []
        self.grad_norms: list[float] = []
        self.pending: list[
            tuple[torch.Tensor, ...]
        ] = []  # this log window's (loss, grad norm[, z]), on the device
        # wall time and resume steps of the processes before this one
        self.earlier_s, self.resumed_at = 0.0, []
        self.start = 0
        # warnings bound to the console, as the sinks' are: no loop <-> checkpoints cycle
        warn = functools.partial(say_warning, self.console)
        self.checkpoints = checkpoint.Checkpoints(state.dir.path, warn) if self.main else None
        saved = self.resume()
        self.last_checkpoint = time.perf_counter()  # train.checkpoint_minutes counts from here
        self.checkpointed = self.start  # the step of the last checkpoint taken, on every rank alike
        self.sinks = MetricSinks(
            state.dir.path,
            state.cfg,
            enabled=self.main,
            config_hash=state.cfg.config_hash,
            resume_at=(saved["metrics_bytes"], saved["step"]) if saved else None,
            # bound to the console, not to the loop: a loop <-> sinks cycle would keep the run's model
            # alive after it returns, until the garbage collector runs
            warn=functools.partial(say_warning, self.console),
        )

    # ------------------------------------------------------------------------- resuming and checkpoints

    def resume(self) -> dict | None:
        """Continue from the checkpoint ``Checkpoints.resumable`` finds: rank 0 reads the run directory
        and hands what it found to the other ranks."""
        state = self.state
        saved = self.checkpoints.resumable(state.cfg.config_hash, self.tcfg.resume) if self.main else None
        saved = distributed.broadcast(saved)
        if saved is not None:
            checkpoint.restore(state, saved, self.console)
            loop = saved["loop"]
            self.start = saved["step"]
            self.val_losses, self.grad_norms, self.timer.times = (
                loop["val_losses"],
                loop["grad_norms"],
                loop["step_times"],
            )
            self.pending = [tuple(row.to(state.device)) for row in loop["pending"]]
            if self.stats is not None:  # the logit peaks seen before the interruption still count
                self.stats.peaks.update(
                    {k: v for k, v in loop.get("peaks", {}).items() if k in self.stats.peaks}
                )
            self.earlier_s, self.resumed_at = loop["wall_s"], [*loop["resumed_at"], self.start]
            for phase, seconds in loop.get("time_s", {}).items():
                self.phases.seconds[phase] = self.phases.seconds.get(phase, 0.0) + seconds
            if self.main:
                self.console.print(
                    f"resuming at step {self.start} from the checkpoint in {state.dir.path}", highlight=False
                )
        return saved

    def warn(self, message: str) -> None:
        say_warning(self.console, message)

    def wall_s(self) -> float:
        return self.earlier_s + time.perf_counter() - self.started

    @property
    def saved_step(self) -> int | None:
        """The step the newest checkpoint complete on disk resumes at (None: none is)."""
        return self.checkpoints.saved if self.checkpoints is not None else None

    def checkpoint_due(self, done: int) -> bool:
        """Whether a checkpoint is due after ``done`` updates: every ``train.checkpoint_every`` steps, or
        where that is null every ``train.checkpoint_minutes`` of wall time, looked at the end of a log
        window (where the ranks sync anyway: rank 0's clock decides for all)."""
        if done <= self.start:
            return False
        every = self.tcfg.checkpoint_every
        if every is not None:
            return bool(every) and done % every == 0
        if done % self.tcfg.log_every:
            return False
        due = time.perf_counter() - self.last_checkpoint >= 60 * self.tcfg.checkpoint_minutes
        return bool(distributed.broadcast(due))

    def checkpoint(self, done: int, now: bool = False) -> None:
        """A checkpoint after ``done`` updates when one is due, or ``now`` (a stop signal came)."""
        if not (now or self.checkpoint_due(done)):
            return
        self.timer.settle()
        with self.phases("checkpoints"):
            self._save_checkpoint(done)
        self.timer.resume()

    def final_checkpoint(self, done: int) -> None:
        """Under the wall-time cadence, one more at the last step, before the end-of-run checks: a run
        killed in them or in its summary does not train again."""
        if self.tcfg.checkpoint_every is None and done > self.checkpointed:
            self.timer.settle()
            with self.phases("checkpoints"):
                self._save_checkpoint(done)

    def _save_checkpoint(self, done: int) -> None:
        loop = {
            "val_losses": self.val_losses,
            "grad_norms": self.grad_norms,
            "step_times": self.timer.times,
            "pending": torch.stack([torch.stack(p) for p in self.pending])
            if self.pending
            else torch.empty(0, 2),
            "wall_s": self.wall_s(),
            "resumed_at": self.resumed_at,
            "peaks": dict(self.stats.peaks) if self.stats is not None else {},
            "time_s": dict(self.phases.seconds),
        }
        saved = {
            **checkpoint.capture(self.state),
            "step": done,
            "config_hash": self.state.cfg.config_hash,
            "metrics_bytes": self.sinks.position(),
            "loop": loop,
        }
        if self.main:
            self.checkpoints.save(done, saved)
        self.last_checkpoint, self.checkpointed = time.perf_counter(), done

    # ------------------------------------------------------------------------- the step and its cadences

    def step(self, step: int) -> None:
        """Update ``step`` (1-based), with per-layer statistics when they are due."""
        # The gradients of update `step` are taken after step - 1 updates: that is their label.
        collect = self.stats is not None and (step - 1) % self.tcfg.stats_every == 0
        self.lr = self.state.scheduler.get_last_lr()[0]
        with self.phases("steps"):
            loss, grad_norm = self.state.train_step(self.stats if collect else None)
        if collect:
            with self.phases("statistics"):
                self.sinks.log(self.stats.record(step - 1, grad_norm, self.tcfg.grad_clip))
        z_term = self.state.z_term
        self.pending.append((loss, grad_norm) if z_term is None else (loss, grad_norm, z_term))
        self.timer.tick()

    def log_window(self, step: int) -> dict | None:
        """At the end of a log window: its train record, logged (else None). The one host sync of the
        window, and the one all-reduce: every rank sees the same losses."""
        if step % self.tcfg.log_every and step != self.tcfg.steps:
            return None
        with self.phases("logging"):
            return self._log_window(step)

    def _log_window(self, step: int) -> dict:
        window_s = self.timer.end_window(len(self.pending))
        window = distributed.all_mean(torch.stack([torch.stack(p) for p in self.pending]).float())
        losses, norms, *z_terms = window.T.tolist()
        self.grad_norms += norms
        record = {
            "kind": "train",
            "step": step,
            "train_loss": sum(losses) / len(losses),
            "lr": self.lr,
            "grad_norm": norms[-1],
            "tokens_per_s": len(self.pending) * self.tokens_per_step / window_s,
            "step_ms": 1000 * window_s / len(self.pending),
            "tokens": step * self.tokens_per_step,
            **({"z_loss": sum(z_terms[0]) / len(z_terms[0])} if z_terms else {}),
        }
        self.sinks.log(record)
        self.pending = []
        self.diverged = not all(math.isfinite(v) and v < self.state.threshold for v in losses)
        return record

    def evaluate(self, step: int, due: bool = True) -> None:
        """Validation loss at step 0, every ``eval_every`` steps and at the last step."""
        if due or self.eval_due(step):
            with self.phases("eval"):
                val_loss = self.state.evaluate()
            self.record_eval(step, val_loss)

    def eval_due(self, step: int) -> bool:
        return step % self.tcfg.eval_every == 0 or step == self.tcfg.steps

    def record_eval(self, step: int, val_loss: float) -> None:
        """Log the validation loss measured after ``step`` updates (batched seeds measure it for all
        their seeds at once: normbench.training.batched)."""
        self.val_losses.append(val_loss)
        record = {"kind": "eval", "step": step, "val_loss": val_loss}
        if step == 0:  # what a run that ignores its context would end at (normbench.report.load)
            targets = torch.cat([y.flatten() for _, y in self.state.val])
            record["unigram_loss"] = unigram_entropy(targets, self.state.data.vocab_size)
        bpb = bits_per_byte(val_loss, self.state.data.bytes_per_token)
        if bpb is not None:
            record["val_bpb"] = bpb
        self.sinks.log(record)
        self.timer.resume()


def train(run, run_dir: Path, console: Console | None = None) -> dict:
    """Train one configuration; return (and write) its summary. Raises ConfigError on bad input.

    The run in order: the norms' kernels and config.yaml; ``Run`` builds the devices, the data, the
    model, its wrapping (DDP, torch.compile), the optimizer and the schedule; ``Loop`` resumes from a
    checkpoint; the steps; the causality probe and the summary."""
    console = console or Console(stderr=True)
    started, phases = time.perf_counter(), Phases()
    build_kernels(run, phases)
    keep_config(run, run_dir)
    with phases("setup"):
        free_earlier_runs()  # before anything of this run exists
        state = Run(run, run_dir)  # devices, data, model, wrap, optimizer, schedule
        say_setup(console, state)
        loop = Loop(state, console, started, phases)
    status, error, step, stop = run_steps(loop)
    if status == "interrupted":
        return interrupted(loop, stop, step)
    return finish(loop, status, error, step)


def build_kernels(run, phases: Phases) -> None:
    """The fused norms' kernels, built when this run needs them: once per machine, and never inside a
    timed phase."""
    if impls.builds_kernels(run.norm_impl, resolve_device(run.train.device)):
        with phases("kernel_build"):
            kernels.available()


def keep_config(run, run_dir: Path) -> None:
    """train() from Python keeps its config as the CLI does (unless the caller gave the run another
    identity)."""
    if (
        run.source is not None
        and not (Path(run_dir) / CONFIG).exists()
        and config_hash(run.source) == run.config_hash
    ):
        RunDir(run_dir).write_config(run.source)


def run_steps(loop: Loop) -> tuple[str, str | None, int, StopSignals | None]:
    """The steps from where the run stands to train.steps, each a list of the components whose turn it
    is; returns (status, error, the last step, the stop signals)."""
    state, tcfg, console = loop.state, loop.tcfg, loop.console
    status, error, step, stop = "completed", None, loop.start, None
    try:
        if loop.start == 0:
            loop.evaluate(0)
        loop.timer.resume()
        with (
            TrainProgress(console, tcfg.progress and loop.main, tcfg.steps, loop.start) as bar,
            StopSignals() as stop,
        ):
            for step in range(loop.start + 1, tcfg.steps + 1):
                # The end of step - 1: checkpoint when due, or when a stop signal came (SLURM preemption).
                if stop.requested(step - 1, tcfg.log_every, state.device):
                    loop.checkpoint(step - 1, now=True)
                    status, step = "interrupted", step - 1
                    break
                loop.checkpoint(step - 1)
                loop.step(step)
                record = loop.log_window(step)
                if record is not None:
                    bar.update(record)
                    if loop.diverged:
                        status = "diverged"
                        break
                # every eval_every steps whatever the log window: the two cadences are independent
                loop.evaluate(step, due=False)
                if record is not None:
                    loop.sinks.flush()  # trackers send the window's records in one call
        if status == "completed":
            loop.final_checkpoint(step)
    except KeyboardInterrupt:
        loop.sinks.abort()
        raise
    except DiskFull as err:  # the run stops where it is, resumable: nothing more can be written
        loop.sinks.abort()
        err.resume_step = loop.saved_step
        raise
    except Exception as err:  # a crash is recorded as a failed run, never as a completed one
        status, error = "failed", f"{type(err).__name__}: {err}"
        if loop.main:
            state.dir.write_error(traceback.format_exc())
        else:
            console.print(traceback.format_exc(), markup=False, highlight=False)
    finally:
        loop.sinks.close()
    return status, error, step, stop

"""Data-parallel training under torchrun: the process group, the batch split, the metric averages.

torchrun starts one process per device and tells each one its place through the
environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT).
This module owns everything that reads those variables: joining the group (gloo on
the CPU, NCCL on CUDA, one GPU per process: cuda:LOCAL_RANK), wrapping the model in
DistributedDataParallel (BatchNorm made synchronous first, unless ``norm.sync=false``),
slicing each rank's share out of the global batch, averaging metrics across ranks,
and leaving the group (in order, or at once when the run failed: ``abandon``). Outside
torchrun every function is the single-process no-op, so the training loop reads the same
either way.

The rule that makes a run independent of its world size: every rank draws the whole
global batch (``train.batch_size``) from the same seeded generator and keeps its own
contiguous slice. The slices are equal, so DDP's average of the ranks' gradients is
the gradient of the global batch's mean loss, and the mean of the ranks' losses is
the global batch's loss.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from normbench.core.errors import ConfigError
from normbench.model.norms import BatchNorm

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def launched() -> bool:
    """True in a process that torchrun (or any launcher setting its variables) started."""
    return all(key in os.environ for key in TORCHRUN_VARS)


def rank() -> int:
    if dist.is_initialized():
        return dist.get_rank()
    return int(os.environ["RANK"]) if launched() else 0


def world_size() -> int:
    if dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ["WORLD_SIZE"]) if launched() else 1


def is_main() -> bool:
    """Rank 0 alone writes the run directory and talks to the terminal."""
    return rank() == 0


def setup(device: torch.device) -> torch.device:
    """Join torchrun's process group (once per process) and return this rank's device.

    ``device`` is what ``train.device`` resolved to. On CUDA each process takes the
    GPU numbered by its LOCAL_RANK, so ``cuda`` and ``auto`` are the settings that
    make sense here; the CPU runs every rank on the host's cores.
    """
    if not launched():
        return device
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if device.type == "cuda":
        if device.index is not None and local_world > 1:
            raise ConfigError(
                f"train.device={device} under torchrun with {local_world} processes per node: each process "
                "uses the GPU cuda:LOCAL_RANK (choose GPUs with CUDA_VISIBLE_DEVICES)",
                allowed=["auto", "cuda", "cpu"],
            )
        index = device.index if device.index is not None else local_rank
        # Checked on every rank from the same numbers, so every rank fails together instead of some hanging.
        if local_world > torch.cuda.device_count():
            raise ConfigError(
                f"torchrun started {local_world} processes on this node but it has "
                f"{torch.cuda.device_count()} GPU(s); use --nproc_per_node={torch.cuda.device_count()} or "
                "fewer"
            )
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return device


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def abandon(code: int) -> NoReturn:
    """End this rank of a failed run now, with ``code``, without leaving the group in order.

    A rank that failed may never join the collective its peers wait in (the gradient all-reduce of
    the step it failed in), and leaving in order would wait for them: ``destroy_process_group``
    first lets NCCL's pending work finish. Exiting at once instead lets torchrun see the failure
    and stop the other ranks (a gloo peer sees the closed connection even sooner), so a failure on
    one rank ends the run in seconds, not at the collective timeout. Python's exit handlers and
    finalizers are skipped: what the run writes is written and closed before this.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def local_batch_size(batch_size: int) -> int:
    """This rank's share of the global batch; the split must be even for the equal-slices rule."""
    n = world_size()
    if batch_size % n:
        below = batch_size - batch_size % n
        raise ConfigError(
            f"train.batch_size={batch_size} is the global batch and must split evenly across the {n} "
            "processes",
            allowed=[b for b in (below, below + n) if b > 0],
        )
    return batch_size // n


def shard(batch: torch.Tensor) -> torch.Tensor:
    """This rank's contiguous slice of a global batch (dim 0); the whole batch in one process."""
    n = world_size()
    if n == 1:
        return batch
    size = local_batch_size(batch.shape[0])
    return batch[rank() * size : (rank() + 1) * size]


def gradients_kept_local(step_model: nn.Module, local: bool):
    """Around a micro-step's backward: under DDP, ``local`` skips the all-reduce (``no_sync``), so the
    gradients are summed on each rank and reduced once, at the last micro-step."""
    if local and isinstance(step_model, DistributedDataParallel):
        return step_model.no_sync()
    return contextlib.nullcontext()


def all_mean(values: torch.Tensor) -> torch.Tensor:
    """The element-wise mean of ``values`` over the ranks: one collective, whatever its size."""
    if world_size() == 1:
        return values
    values = values.clone()
    dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values / world_size()


def trains(go: bool, device: torch.device) -> bool:
    """Rank 0's word to every rank, once the group is joined: whether this run trains. A result already
    in the run directory, or a refusal, ends every rank with rank 0, not rank 0 alone: the others
    would wait for it in the group until its timeout."""
    if world_size() == 1:
        return go
    flag = torch.tensor([1.0 if go else 0.0], device=device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def release(device: torch.device) -> None:
    """Rank 0 with nothing to train: join the group, tell the other ranks, and leave it."""
    if world_size() > 1:
        trains(False, setup(device))
        teardown()


def all_max(values: torch.Tensor) -> torch.Tensor:
    """The element-wise maximum of ``values`` over the ranks."""
    if world_size() == 1:
        return values
    values = values.clone()
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return values


def gather(obj) -> list:
    """Every rank's ``obj`` (small picklable values), in rank order, on every rank."""
    if world_size() == 1:
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast(obj):
    """Rank 0's ``obj`` on every rank (the rank that read a file shares it)."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class _AllReduceSum(torch.autograd.Function):
    """Sum over the ranks, differentiable: every rank's loss depends on every rank's input, so the
    gradient arriving at the sum is itself summed over the ranks."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class CpuSyncBatchNorm(nn.BatchNorm1d):
    """BatchNorm1d whose training statistics cover every rank's tokens, for gloo on the CPU.

    ``nn.SyncBatchNorm`` refuses CPU tensors, so this does the same computation with one
    differentiable all-reduce per call: the per-channel sums of x and x^2 and the
    token count. Its backward all-reduces the gradient of those sums, which is how
    each rank's loss reaches the other ranks' inputs (as SyncBatchNorm's backward does).
    Eval mode, and a single process, fall through to plain BatchNorm1d.
    """

    @classmethod
    def convert(cls, bn: nn.BatchNorm1d) -> CpuSyncBatchNorm:
        sync = cls(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats)
        # The same Parameter objects: an optimizer built before the swap keeps updating them.
        sync.weight, sync.bias = bn.weight, bn.bias
        sync.running_mean, sync.running_var, sync.num_batches_tracked = (
            bn.running_mean,
            bn.running_var,
            bn.num_batches_tracked,
        )
        sync.train(bn.training)
        return sync

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        channels = x.shape[1]
        # float64 so that E[x^2] - E[x]^2 does not cancel away the variance.
        x64 = x.double()
        count = torch.tensor([x.shape[0]], dtype=torch.float64, device=x.device)
        sums = _AllReduceSum.apply(torch.cat([x64.sum(0), (x64 * x64).sum(0), count]))
        n = sums[-1]
        mean = sums[:channels] / n
        var = (sums[channels : 2 * channels] / n - mean * mean).clamp_min(0)
        if self.track_running_stats:
            with torch.no_grad():  # as BatchNorm1d: the running variance is the unbiased one
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), self.momentum)
                unbiased = var * n / (n - 1).clamp_min(1)
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), self.momentum)
                self.num_batches_tracked.add_(1)
        out = (x64 - mean) * torch.rsqrt(var + self.eps)
        if self.affine:
            out = out * self.weight + self.bias
        return out.to(x.dtype)


def wrap(model: nn.Module, device: torch.device) -> nn.Module:
    """The module a training step calls: DDP around ``model`` under torchrun, ``model`` itself otherwise.

    BatchNorm norms with ``sync=True`` get synchronous statistics first (torch's
    SyncBatchNorm on CUDA, ``CpuSyncBatchNorm`` on the CPU), swapped into ``model``
    in place, so evaluating and probing ``model`` itself still works on every rank.
    DDP copies rank 0's weights and buffers to every rank here.
    """
    if not dist.is_initialized():
        return model
    for module in list(model.modules()):  # a list: the loop replaces children as it goes
        if isinstance(module, BatchNorm) and module.sync:
            if device.type == "cuda":
                module.bn = nn.SyncBatchNorm.convert_sync_batchnorm(module.bn)
            else:
                module.bn = CpuSyncBatchNorm.convert(module.bn)
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def batchnorm_sync(model: nn.Module) -> bool | None:
    """For the summary: the BatchNorm norms' ``sync`` setting; None for a model without BatchNorm."""
    settings = [module.sync for module in model.modules() if isinstance(module, BatchNorm)]
    return all(settings) if settings else None

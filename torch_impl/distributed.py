"""Eager PyTorch as several cooperating processes (compare --processes N): torch.distributed with
gloo, data parallel over the same global batch, or tensor parallel for a twin whose torch side is
per-rank code.

Each process trains a whole replica on its contiguous share of every global batch
(common.data.process_slice, the rows JAX gives the same process) and the gradients are averaged over
the processes before clipping and the update, so every replica takes the same step. That is the
global batch's gradient exactly when the loss is a mean over equal shares of rows and nothing in the
forward mixes rows: the task's built-in losses (cross-entropy and mean squared error are means over
every position) on a model without BatchNorm. A twin's own loss, BatchNorm (its train-mode
statistics would be each process's rows; torch.nn.SyncBatchNorm runs only on GPUs) and common's
exact dropout masks (drawn for the whole batch's shape) are refused in one line rather than compared
wrongly. A mesh's axes other than data are not split: eager torch computes the same numbers
replicated.

A twin whose NNX side takes the mesh (`nnx_mesh_arg`: shard_map regions) declares its torch side
per-rank code. Its processes are then the mesh's devices, one rank each, numbered as Megatron
numbers them (the tensor axis innermost: one tensor group's ranks are consecutive): a process takes
the rows of its batch share (data x fsdp; the ranks of one tensor group the same rows) and its code
finds its rank and group in torch.distributed. That code keeps every rank's gradient the whole one
(Megatron's reductions), so the average over the processes is the average over the shares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from common.data import Batch, process_slice
from common.multiprocess import (
    other_settings,
    refuse_per_rank_processes,
    refuse_taken_port,
    settings_digest,
)
from common.spec import RunSpec, SpecError
from common.twin import twin_of
from common.vocab import MaskSource
from torch_impl import ranks
from torch_impl.models import at_least_float32

ONE_PROCESS = (
    "compare torch in a run without --processes (or leave it out of --backend in this one)"
)
IGNORED = -100  # torch's cross-entropy's ignore_index
TIMEOUT_S = 300  # a process waiting on one that died: the launcher stops them all long before


@dataclass(frozen=True)
class Group:
    """This process's place among the run's processes."""

    rank: int
    size: int
    shares: int  # how many ways the rows are split: one per process, or the mesh's data x fsdp

    @property
    def share(self) -> int:
        """Which share of the rows this process takes (ranks of one tensor group alike)."""
        return self.rank // (self.size // self.shares)


def join(spec: RunSpec, options) -> Group | None:
    """Join the run's process group (`--coordinator HOST:PORT --num-processes N --process-id I`,
    what compare --processes passes), after refusing what data parallelism would compute
    differently; None when alone."""
    size, rank, coordinator = (
        options.own.num_processes,
        options.own.process_id,
        options.own.coordinator,
    )
    if size <= 1:
        return None
    if not coordinator:
        raise SpecError(
            f"--num-processes {size}: give --coordinator HOST:PORT, process 0's address"
        )
    shares = row_shares(spec, size)
    refuse_inexact(spec, size, shares)
    refuse_taken_port(coordinator, rank)
    import datetime

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{coordinator}",
        world_size=size,
        rank=rank,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
    )
    check_same_settings(spec, size, rank)
    if twin_of(spec.model).nnx_mesh_arg:  # the ranks of a per-rank twin: torch's mesh, as the run's
        from torch.distributed.device_mesh import init_device_mesh

        ranks.DEVICE_MESH = init_device_mesh(
            "cpu", tuple(spec.mesh.shape.values()), mesh_dim_names=tuple(spec.mesh.shape)
        )
    return Group(rank, size, shares)


def row_shares(spec: RunSpec, size: int) -> int:
    """How many ways `size` processes split the rows: one share each (data parallel), or the mesh's
    data x fsdp when they are the ranks of a per-rank twin, one per device of its mesh."""
    if twin_of(spec.model).nnx_mesh_arg is None:
        return size
    refuse_per_rank_processes(spec, size)
    return spec.mesh.batch_replicas


def check_same_settings(spec: RunSpec, size: int, rank: int) -> None:
    """Every process was given the same training settings and mesh (common/multiprocess.py): each
    one's digest, gathered by all; a process given others would wait on the rest's collectives until
    --timeout."""
    digest = torch.tensor([settings_digest(spec)], dtype=torch.int64)
    gathered = [torch.zeros_like(digest) for _ in range(size)]
    dist.all_gather(gathered, digest)
    if len({int(d) for d in gathered}) > 1:
        dist.destroy_process_group()
        raise other_settings(spec, size, rank)


def refuse_inexact(spec: RunSpec, size: int, shares: int) -> None:
    """What averaging the processes' gradients would not make the global batch's gradient."""
    why = (
        f"eager torch on {size} processes averages each process's gradient over its share of "
        "the batch"
    )
    loss = twin_of(spec.model).loss
    if loss:
        shown = loss.get("torch", loss) if isinstance(loss, Mapping) else loss
        raise SpecError(
            f"{why}, which equals the whole batch's only for a mean over rows; the twin's own loss "
            f"({shown}) may not be one: {ONE_PROCESS}"
        )
    if spec.train.dropout_masks == MaskSource.COMMON:
        raise SpecError(
            f"{why}; common's exact dropout masks are drawn for the whole batch: use --parity-mode "
            f"statistical with --processes, or {ONE_PROCESS}"
        )
    if spec.train.global_batch_size % shares:
        raise SpecError(
            f"{why}: train.global_batch_size={spec.train.global_batch_size} does not split evenly "
            + (f"over {size} processes" if shares == size else f"into {shares} (data x fsdp)")
            + "; give a batch size they divide"
        )


def refuse_batch_norm(model: torch.nn.Module, size: int) -> None:
    """BatchNorm in train mode normalizes by the statistics of the rows it sees: each process's, not
    the batch's."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            raise SpecError(
                f"eager torch on {size} processes: module {name} is {type(module).__name__}, whose "
                "train-mode statistics would be each process's rows, not the whole batch's "
                f"(torch.nn.SyncBatchNorm runs only on GPUs); {ONE_PROCESS}"
            )


def local_rows(batch: Batch, group: Group | None) -> Batch:
    """This process's share of a global batch (the whole batch when alone). Targets torch's
    cross-entropy ignores (-100) make its mean one over the positions kept, which differ from
    process to process: refused."""
    if group is None:
        return batch
    targets = batch.targets if isinstance(batch.targets, np.ndarray) else None
    if targets is not None and targets.dtype.kind in "iu" and (targets == IGNORED).any():
        raise SpecError(
            f"eager torch on {group.size} processes: the batch holds targets of {IGNORED}, which "
            "cross-entropy leaves out of its mean, so the processes' means do not average to the "
            "whole "
            f"batch's; {ONE_PROCESS}"
        )
    return process_slice(batch, group.share, group.shares)


def average_gradients(parameters, group: Group | None) -> None:
    """Every parameter's gradient averaged over the processes, in one all-reduce of a flat
    buffer."""
    if group is None:
        return
    grads = [p.grad for p in parameters if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= group.size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def mean_value(value: torch.Tensor, group: Group | None) -> torch.Tensor:
    """A scalar (the loss) averaged over the processes: the whole batch's mean over equal shares."""
    if group is None:
        return value
    total = at_least_float32(value.detach()).clone()
    dist.all_reduce(total)
    return total / group.size


def gather_rows(array: np.ndarray, group: Group | None) -> np.ndarray:
    """Every share's rows of an output, in order: the whole batch's (one process of each share)."""
    if group is None:
        return array
    parts = [None] * group.size
    dist.all_gather_object(parts, array)
    return np.concatenate(parts[:: group.size // group.shares])


def leave(group: Group | None) -> None:
    if group is not None and dist.is_initialized():
        dist.destroy_process_group()

"""Replicas of one xmp.spawn run meeting each other: the gradient all-reduce, the compile barrier
and the end-of-run agreement check (docs/xmp-spawn-cpu.md says why CPU needs each). The train loop
uses these; `spawn.py` starts the replicas."""

from __future__ import annotations

import os
import threading

import torch
import torch_xla
import torch_xla.core.xla_model as xm

from common.vocab import RecordStatus

_LOCK = threading.Lock()
_BARRIERS: dict[int, threading.Barrier] = {}
_CHECKSUMS: dict[int, float] = {}


def cpu_threads() -> bool:
    """PJRT on CPU runs xmp.spawn replicas as threads of one process."""
    return os.environ.get("PJRT_DEVICE") == "CPU"


_RELEASED = threading.Event()  # a replica failed: every barrier, present or later, is broken


def _barrier(world: int) -> threading.Barrier:
    with _LOCK:
        barrier = _BARRIERS.setdefault(world, threading.Barrier(world))
        if _RELEASED.is_set():
            barrier.abort()
        return barrier


def release_barriers() -> None:
    """A replica that fails: every replica waiting at a barrier gets BrokenBarrierError instead of
    waiting for it forever."""
    with _LOCK:
        _RELEASED.set()
        for barrier in _BARRIERS.values():
            barrier.abort()


def bucketed_all_reduce(params, loss, world: int):
    """Average every gradient and the loss over the replicas in one collective; returns the mean
    loss."""
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1).to(grads[0].dtype)])
    flat = torch_xla._XLAC._xla_spmd_all_reduce(
        xm.REDUCE_SUM, flat, 1.0 / world, [list(range(world))]
    )
    offset = 0
    for p, g in zip(params, grads):
        p.grad = flat[offset : offset + g.numel()].view_as(g)
        offset += g.numel()
    return flat[offset]


def sync_step(trainer, step: int, settle_steps: int) -> None:
    """CPU threads: while graphs still compile, all replicas start their sync (and so their
    compile of the same graph) together, keeping the skew at the first all-reduce small."""
    if step < settle_steps:
        _barrier(trainer.replicas).wait()
    torch_xla.sync()


def check_replicas_agree(trainer, record) -> None:
    """CPU threads: every replica must end with the same parameters, or the run is marked failed."""
    if not cpu_threads():
        return
    # Copies to the host are transfers, not graphs: the check adds no compile.
    checksum = float(sum(p.detach().cpu().double().sum() for p in trainer.model.parameters()))
    _CHECKSUMS[trainer.replica] = checksum
    _barrier(trainer.replicas).wait()
    if trainer.replica == 0 and len(set(_CHECKSUMS.values())) > 1:
        record.status = RecordStatus.FAILED
        record.message = (
            f"xmp.spawn replicas ended with different parameters (checksums {_CHECKSUMS})"
        )

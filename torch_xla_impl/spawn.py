"""Data parallel with `xmp.spawn`: one replica per device, each on its slice of the global batch.

On TPU, PJRT runs a process per chip and the classic `xm.optimizer_step`
(gradient all-reduce, then step) is used unchanged.

On CPU, PJRT runs one *thread* per device in one process, and torch_xla
2.9's gradient all-reduce hangs there. Root cause (docs/xmp-spawn-cpu.md):
each replica thread compiles its own executable, and XLA's CPU collectives
key their rendezvous by `op_id = channel_id if set, else the HloModule's
process-wide unique_id`. `xm.all_reduce`/`reduce_gradients` build the
all-reduce without a channel id, so two replicas' modules get different ids
(`op_id=0` vs `op_id=1`) and wait for each other forever; after 10 s XLA
aborts the process. The fix here:
  - one bucketed all-reduce per step (all gradients and the loss flattened
    into one vector) through `_xla_spmd_all_reduce`, which sets a fixed
    channel id, so every replica's module uses the same rendezvous key;
  - while graphs still compile, the replicas wait for each other before
    each sync, so they compile the same graph at the same time and reach the
    first all-reduce together: XLA's CPU rendezvous aborts the process when a
    participant is more than 10 s late. Compiling each graph ahead
    (`_xla_warm_up_cache`) and then syncing exactly those tensors
    (`_xla_sync_multi`) was tried: MpDeviceLoader's own `torch_xla.sync()`
    then met parameter buffers that the step had donated ("buffer ... is
    deleted").
Limits: at most one replica per core (4 replicas on 2 cores ended with
different parameters); a graph whose compile skew exceeds 10 s still aborts.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures.process import BrokenProcessPool

from common.spec import RunSpec

_LOCK = threading.Lock()
_BARRIERS: dict[int, threading.Barrier] = {}
_CHECKSUMS: dict[int, float] = {}


def cpu_threads() -> bool:
    """PJRT on CPU runs xmp.spawn replicas as threads of one process."""
    return os.environ.get("PJRT_DEVICE") == "CPU"


def _barrier(world: int) -> threading.Barrier:
    with _LOCK:
        return _BARRIERS.setdefault(world, threading.Barrier(world))


def bucketed_all_reduce(params, loss, world: int):
    """Average every gradient and the loss over the replicas in one collective; returns the mean loss."""
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm

    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1).to(grads[0].dtype)])
    flat = torch_xla._XLAC._xla_spmd_all_reduce(xm.REDUCE_SUM, flat, 1.0 / world, [list(range(world))])
    offset = 0
    for p, g in zip(params, grads):
        p.grad = flat[offset:offset + g.numel()].view_as(g)
        offset += g.numel()
    return flat[offset]


def sync_step(trainer, step: int, settle_steps: int) -> None:
    """CPU threads: while graphs still compile, all replicas start their sync (and so their
    compile of the same graph) together, keeping the skew at the first all-reduce small."""
    import torch_xla

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
        record.status = "failed"
        record.message = f"xmp.spawn replicas ended with different parameters (checksums {_CHECKSUMS})"


def _replica(index: int, spec_dict: dict, options: dict) -> None:
    import torch_xla.runtime as xr

    from common.backend_main import progress_printer
    from common.record import write_record, write_tensors
    from torch_xla_impl.instrument import CompileMonitor, NoMonitor
    from torch_xla_impl.train import run

    spec = RunSpec.from_dict(spec_dict, name=spec_dict.get("name", "custom"))
    ordinal, world = xr.global_ordinal(), xr.world_size()
    out_dir = options["out_dir"]
    record, tensors = run(spec, out_dir, parity=options["parity"], checkpoint=options["checkpoint"],
                          monitor=CompileMonitor() if ordinal == 0 else NoMonitor(),
                          throughput_steps=options["throughput_steps"], shape_change_step=options["shape_change_step"],
                          mode="spawn", replica=ordinal, replicas=world,
                          progress=progress_printer(options["progress"] and ordinal == 0))
    if ordinal == 0:
        if tensors:
            record.tensors = write_tensors(out_dir, tensors)
        write_record(out_dir, record)


def run_spawn(spec: RunSpec, args, out_dir, progress_enabled: bool):
    """Run the replicas; replica 0 writes the record, which is read back here."""
    import torch_xla.distributed.xla_multiprocessing as xmp

    from common.record import read_record

    options = {"out_dir": out_dir, "parity": args.parity, "checkpoint": args.checkpoint,
               "throughput_steps": args.throughput_steps, "shape_change_step": args.shape_change_step,
               "progress": progress_enabled}
    try:
        xmp.spawn(_replica, args=(spec.to_dict(), options))
    except BrokenProcessPool:
        raise RuntimeError("an xmp.spawn replica process died (on CPU usually XLA's 10 s all-reduce rendezvous "
                           "timeout, see xla_debug.log and docs/xmp-spawn-cpu.md); retry or use --mode spmd") from None
    return read_record(out_dir), {}, True

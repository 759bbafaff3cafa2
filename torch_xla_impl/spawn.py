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
aborts the process. The fix (`replicas.py`):
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

from concurrent.futures.process import BrokenProcessPool

from common.spec import RunSpec
from common.spec_parse import run_spec_from_dict


def _replica(index: int, spec_dict: dict, options: dict) -> None:
    import torch_xla.runtime as xr

    from common.backend_main import progress_printer
    from common.record import write_record, write_tensors
    from torch_xla_impl.instrument import CompileMonitor, NoMonitor
    from torch_xla_impl.train import run

    spec = run_spec_from_dict(spec_dict, name=spec_dict.get("name", "custom"))
    ordinal, world = xr.global_ordinal(), xr.world_size()
    out_dir = options["out_dir"]
    record, tensors = run(spec, out_dir, parity=options["parity"], checkpoint=options["checkpoint"],
                          monitor=CompileMonitor() if ordinal == 0 else NoMonitor(),
                          throughput_steps=options["throughput_steps"], provocations=options["provocations"],
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
               "throughput_steps": args.throughput_steps, "provocations": args.provoke,
               "progress": progress_enabled}
    try:
        xmp.spawn(_replica, args=(spec.to_dict(), options))
    except BrokenProcessPool:
        raise RuntimeError("an xmp.spawn replica process died (on CPU usually XLA's 10 s all-reduce rendezvous "
                           "timeout, see xla_debug.log and docs/xmp-spawn-cpu.md); retry or use --mode spmd") from None
    return read_record(out_dir), {}

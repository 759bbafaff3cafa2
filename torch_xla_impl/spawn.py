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

import json
import shutil
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from common.cli import INPUT_ERRORS
from common.spec import RunSpec
from common.spec.parse import run_spec_from_dict
from driver.harness import RunOptions

# each failing replica's exception, read back by run_spawn, then removed
ERRORS_DIR = ".replica-errors"


def _replica(index: int, spec_dict: dict, options: RunOptions, progress: bool) -> None:
    import torch_xla.runtime as xr

    from common.files.record import write_record
    from common.files.tensor_file import write_tensors
    from driver import harness
    from driver.backend_main import progress_printer
    from torch_xla_impl.instrument import CompileMonitor, NoMonitor
    from torch_xla_impl.train import make_trainer

    spec = run_spec_from_dict(spec_dict, name=spec_dict.get("name", "custom"))
    ordinal, world = xr.global_ordinal(), xr.world_size()
    monitor = CompileMonitor() if ordinal == 0 else NoMonitor()
    record, tensors = harness.run(
        lambda: make_trainer(spec, options, monitor, mode="spawn", replica=ordinal, replicas=world),
        options,
        progress_printer(progress and ordinal == 0),
    )
    if ordinal == 0:
        if tensors:
            record.tensors = write_tensors(options.out_dir, tensors, options.tensors)
        write_record(options.out_dir, record)


def _reporting_replica(
    index: int, replica, spec_dict: dict, options: RunOptions, progress: bool
) -> None:
    """Run `replica`; an exception it raises is written down first (the other replicas may then
    abort the process in XLA's rendezvous before it travels back), and on CPU the replicas waiting
    for this one at a barrier are released instead of waiting forever."""
    try:
        replica(index, spec_dict, options, progress)
    except Exception as e:
        errors = Path(options.out_dir) / ERRORS_DIR
        errors.mkdir(exist_ok=True)
        (errors / f"{index}.json").write_text(
            json.dumps(
                {"replica": index, "time": time.time(), "type": type(e).__name__, "message": str(e)}
            )
        )
        from torch_xla_impl import replicas

        replicas.release_barriers()
        raise


def first_replica_error(out_dir: Path) -> Exception | None:
    """The first exception any replica raised, as the type the same input raises elsewhere when it
    is an input error (one line, exit 2), else a RuntimeError naming the replica; the notes are
    removed."""
    errors = Path(out_dir) / ERRORS_DIR
    notes = sorted(
        (json.loads(p.read_text()) for p in errors.glob("*.json")), key=lambda n: n["time"]
    )
    shutil.rmtree(errors, ignore_errors=True)
    if not notes:
        return None
    first = notes[0]
    for cls in INPUT_ERRORS:
        if cls.__name__ == first["type"]:
            return cls(first["message"])
    return RuntimeError(
        f"xmp.spawn replica {first['replica']} raised {first['type']}: {first['message']}"
    )


def run_spawn(spec: RunSpec, options: RunOptions, progress_enabled: bool, replica=_replica):
    """Run the replicas; replica 0 writes the record, which is read back here. A replica's exception
    is raised as itself, whichever way the others ended (a broken barrier, XLA's rendezvous
    abort)."""
    import torch_xla.distributed.xla_multiprocessing as xmp

    from common.files.record import read_record

    out_dir = options.out_dir
    try:
        xmp.spawn(_reporting_replica, args=(replica, spec.to_dict(), options, progress_enabled))
    except Exception as e:
        first = first_replica_error(out_dir)
        if first is not None:
            raise first from None
        if isinstance(e, BrokenProcessPool):
            raise RuntimeError(
                "an xmp.spawn replica process died (on CPU usually XLA's 10 s all-reduce "
                "rendezvous "
                "timeout, see xla_debug.log and docs/xmp-spawn-cpu.md); retry or use --mode spmd"
            ) from None
        raise
    return read_record(out_dir), {}

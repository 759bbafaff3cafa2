"""python -m torch_xla_impl: train a spec with the PyTorch/XLA twin and write a run record."""

from __future__ import annotations

import importlib.util
import sys

from common.cli import fail
from common.procs import exit_process
from common.vocab import ExitCode, MaskSource, TraceMode
from driver import backend_main
from torch_xla_impl.flags import add_flags

for _module in ("torch", "torch_xla"):
    if importlib.util.find_spec(_module) is None:
        fail(
            f"the torch_xla backend needs {_module}, which is not installed in {sys.executable}; "
            "install the "
            "extra (pip install -e '.[torch-xla]') or pass compare --torch-xla-python",
            ExitCode.USAGE,
        )


def check(spec, options) -> None:
    """What --mode spawn cannot do, refused before the run directory exists."""
    if options.own.mode != "spawn":
        return
    from torch_xla_impl import sharding

    sharding.require_spawn_mesh(spec.mesh)
    if options.own.trace_mode != TraceMode.LAZY:
        fail(
            f"--trace-mode {options.own.trace_mode} is not supported with --mode spawn (its CPU "
            "collectives need "
            "the lazy sync); use --mode spmd or --trace-mode lazy",
            ExitCode.USAGE,
        )
    # a replica's slice would need its rows of each mask
    if spec.train.dropout_masks == MaskSource.COMMON:
        fail(
            f"train.dropout_masks={MaskSource.COMMON} is not supported with --mode spawn (each "
            "replica sees "
            "only its slice of the batch); use --mode spmd",
            ExitCode.USAGE,
        )
    if options.profile_steps:
        fail(
            "--profile is not available with --mode spawn (every replica would have to step under "
            "the profiler); "
            "profile the spmd mode: --mode spmd",
            ExitCode.USAGE,
        )


def train(spec, options, progress):
    # Platform, device count, compile-cause printing and HLO dumps are read once,
    # when torch_xla starts: set them first.
    from torch_xla_impl import instrument, sharding

    out_dir = options.out_dir
    sharding.configure_platform(spec.mesh.device_count)
    instrument.configure_debug(out_dir, hlo=options.hlo)
    import torch_xla.runtime as xr

    from driver import harness

    harness.refuse_float64_on(xr.device_type(), spec)
    from torch_xla_impl.spawn import run_spawn
    from torch_xla_impl.train import make_trainer

    with (
        instrument.stderr_to(out_dir / instrument.DEBUG_LOG),
        instrument.removed_at_end(instrument.dump_dir(out_dir)),
    ):
        cache = instrument.enable_compile_cache(options.compile_cache)
        if options.own.mode == "spawn":  # replica 0 writes the record, read back here
            record, tensors = run_spawn(spec, options, progress is not None)
            record.compile_cache = instrument.cache_summary(cache, record.extra.counters or {})
            return record, tensors, True
        if spec.mesh.device_count > 1:
            xr.use_spmd()
        mode, monitor = (
            "spmd" if spec.mesh.device_count > 1 else "single",
            instrument.CompileMonitor(),
        )
        record, tensors = harness.run(
            lambda: make_trainer(spec, options, monitor, mode=mode), options, progress
        )
    # none: nothing trained
    record.compile_cache = instrument.cache_summary(cache, record.extra.counters or {})
    return record, tensors, True


def ops_watch():
    from torch_xla_impl.ops import OpsWatch

    return OpsWatch()


if __name__ == "__main__":
    from torch_xla_impl.instrument import DEBUG_LOG  # framework-free: read before torch_xla starts

    exit_process(
        backend_main.main(
            "torch_xla_impl",
            sys.argv[1:],
            add_flags,
            train,
            check,
            logs=(DEBUG_LOG,),
            ops_watch=ops_watch,
        )
    )

"""python -m torch_impl: train a spec with eager PyTorch (the `torch` backend) and write a run
record."""

from __future__ import annotations

import importlib.util
import sys

from common.cli import fail
from common.procs import exit_process
from common.spec import SpecError
from common.vocab import ExitCode
from driver import backend_main
from driver.process import add_process_flags

if importlib.util.find_spec("torch") is None:
    fail(
        f"the torch backend needs torch, which is not installed in {sys.executable}; install the "
        "extra "
        "(pip install -e '.[torch-xla]') or pass compare --torch-python",
        ExitCode.USAGE,
    )


def train(spec, options, progress):
    from common.twin import twin_of
    from driver import harness
    from torch_impl import distributed
    from torch_impl.train import make_trainer

    # a capture (compare's --activations-only: one example from the start weights) computes alike on
    # one device; so does a twin whose NNX side takes the mesh for its shard_map regions: its torch
    # side is the per-rank code, every rank run on one process
    per_rank = twin_of(spec.model).nnx_mesh_arg is not None
    if spec.mesh.device_count > 1 and options.own.num_processes <= 1 and options.train:
        if not per_rank:
            raise SpecError(
                f"the torch backend runs eagerly on one device; mesh {spec.mesh.strategy} needs "
                f"{spec.mesh.device_count}: drop --mesh for it, run it data parallel as processes "
                "(compare --processes N), or compare the mesh on jax, torch_xla or torchax"
            )
    # its place among several processes (compare --processes N)
    group = distributed.join(spec, options)
    try:
        record, tensors = harness.run(lambda: make_trainer(spec, options, group), options, progress)
    finally:
        distributed.leave(group)
    record.compile_cache = {
        "enabled": False,
        "note": "eager PyTorch compiles nothing (--compile-cache is ignored)",
    }
    if options.profile_steps:
        record.profile = {
            "steps": 0,
            "why": "eager torch writes no XProf trace (torch.profiler writes Chrome "
            "traces); --profile is ignored",
        }
    return record, tensors, group is None or group.rank == 0


if __name__ == "__main__":
    exit_process(backend_main.main("torch_impl", sys.argv[1:], add_process_flags, train))

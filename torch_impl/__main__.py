"""python -m torch_impl: train a spec with eager PyTorch (the `torch` backend) and write a run record."""
from __future__ import annotations

import importlib.util
import sys

from common import backend_main
from common.cli import exit_process, fail
from common.spec import SpecError
from common.vocab import ExitCode

if importlib.util.find_spec("torch") is None:
    fail(f"the torch backend needs torch, which is not installed in {sys.executable}; install the extra "
         "(pip install -e '.[torch-xla]') or pass compare --torch-python", ExitCode.USAGE)


def add_flags(parser) -> None:
    pass


def train(spec, options, progress):
    from common import harness
    from torch_impl.train import make_trainer

    if spec.mesh.device_count > 1:
        raise SpecError(f"the torch backend runs eagerly on one device; mesh {spec.mesh.strategy} needs "
                        f"{spec.mesh.device_count}: drop --mesh for it, or compare the mesh on jax, torch_xla "
                        "or torchax")
    record, tensors = harness.run(lambda: make_trainer(spec, options), options, progress)
    record.compile_cache = {"enabled": False, "note": "eager PyTorch compiles nothing (--compile-cache is ignored)"}
    if options.profile_steps:
        record.profile = {"steps": 0, "why": "eager torch writes no XProf trace (torch.profiler writes Chrome "
                                             "traces); --profile is ignored"}
    return record, tensors, True


if __name__ == "__main__":
    exit_process(backend_main.main("torch_impl", sys.argv[1:], add_flags, train))

"""python -m torchax_impl: train a spec with the torch model on JAX through torchax and write a run record."""
from __future__ import annotations

import importlib.util
import sys

from common import backend_main
from common.cli import exit_process, fail
from common.vocab import ExitCode

for _module in ("torch", "jax", "optax", "torchax"):
    if importlib.util.find_spec(_module) is None:
        fail(f"the torchax backend needs {_module}, which is not installed in {sys.executable}; install the "
             "extra (pip install -e '.[torchax]') or pass compare --torchax-python", ExitCode.USAGE)


def add_flags(parser) -> None:
    pass


def train(spec, options, progress):
    from common import harness
    from jax_impl import sharding
    from jax_impl.instrument import CompileMonitor, enable_compile_cache
    from torchax_impl.train import make_trainer

    sharding.set_cpu_device_count(spec.mesh.device_count)
    sharding.check_platform()  # torchax runs on JAX: a JAX_PLATFORMS this machine lacks is one line and exit 2
    cache = enable_compile_cache(options.compile_cache)
    monitor = CompileMonitor()
    record, tensors = harness.run(lambda: make_trainer(spec, options, monitor), options, progress)
    record.compile_cache = monitor.cache_summary(cache)
    return record, tensors, True


if __name__ == "__main__":
    exit_process(backend_main.main("torchax_impl", sys.argv[1:], add_flags, train))

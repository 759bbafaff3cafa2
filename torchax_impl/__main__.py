"""python -m torchax_impl: train a spec with the torch model on JAX through torchax and write a run
record."""

from __future__ import annotations

import importlib.util
import sys

from common.cli import fail
from common.procs import exit_process
from common.vocab import ExitCode
from driver import backend_main
from driver.process import add_process_flags

for _module in ("torch", "jax", "optax", "torchax"):
    if importlib.util.find_spec(_module) is None:
        fail(
            f"the torchax backend needs {_module}, which is not installed in {sys.executable}; "
            "install the "
            "extra (pip install -e '.[torchax]') or pass compare --torchax-python",
            ExitCode.USAGE,
        )


def train(spec, options, progress):
    from driver import harness
    from jax_impl import sharding
    from jax_impl.instrument import CompileMonitor, enable_compile_cache
    from torchax_impl.train import make_trainer

    # torchax runs on JAX: its devices and multi-process run are JAX's
    writer = sharding.join(spec, options)
    cache = enable_compile_cache(options.compile_cache)
    monitor = CompileMonitor()
    record, tensors = harness.run(lambda: make_trainer(spec, options, monitor), options, progress)
    record.compile_cache = monitor.cache_summary(cache)
    return record, tensors, writer


def ops_watch():
    from torchax_impl.ops import OpsWatch

    return OpsWatch()


if __name__ == "__main__":
    exit_process(
        backend_main.main(
            "torchax_impl", sys.argv[1:], add_process_flags, train, ops_watch=ops_watch
        )
    )

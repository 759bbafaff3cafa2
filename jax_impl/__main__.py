"""python -m jax_impl: train a spec with the JAX/Flax NNX twin and write a run record."""

from __future__ import annotations

import sys

from common.cli import fail
from common.procs import exit_process
from common.vocab import ExitCode
from driver import backend_main
from driver.process import add_process_flags

try:  # a missing framework is a usage error with a one-line fix, not a traceback
    import flax  # noqa: F401
    import jax  # noqa: F401
    import optax  # noqa: F401
except ImportError as e:
    fail(
        f"the jax backend needs {e.name}, which is not installed in {sys.executable}; "
        "install the extra (pip install -e '.[jax]') or pass compare --jax-python",
        ExitCode.USAGE,
    )


def train(spec, options, progress):
    from driver import harness
    from jax_impl import sharding
    from jax_impl.instrument import CompileMonitor, enable_compile_cache
    from jax_impl.train import make_trainer

    # its devices and place in a multi-process run (--coordinator ...)
    writer = sharding.join(spec, options)
    cache = enable_compile_cache(options.compile_cache)
    monitor = CompileMonitor()
    record, tensors = harness.run(lambda: make_trainer(spec, options, monitor), options, progress)
    record.compile_cache = monitor.cache_summary(cache)
    return record, tensors, writer


if __name__ == "__main__":
    exit_process(backend_main.main("jax_impl", sys.argv[1:], add_process_flags, train))

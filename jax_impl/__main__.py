"""python -m jax_impl: train a spec with the JAX/Flax NNX twin and write a run record."""
from __future__ import annotations

import sys

from common import backend_main
from common.cli import exit_process, fail
from common.vocab import ExitCode

try:  # a missing framework is a usage error with a one-line fix, not a traceback
    import flax  # noqa: F401
    import jax
    import optax  # noqa: F401
except ImportError as e:
    fail(f"the jax backend needs {e.name}, which is not installed in {sys.executable}; "
         "install the extra (pip install -e '.[jax]') or pass compare --jax-python", ExitCode.USAGE)


def add_flags(parser) -> None:
    group = parser.add_argument_group("multi-process (jax.distributed)")
    group.add_argument("--coordinator", help="host:port of process 0, e.g. 127.0.0.1:12355")
    group.add_argument("--num-processes", type=int, default=1)
    group.add_argument("--process-id", type=int, default=0)


def train(spec, options, progress):
    from common import harness
    from jax_impl import sharding
    from jax_impl.instrument import CompileMonitor, enable_compile_cache
    from jax_impl.train import make_trainer

    processes = options.own["num_processes"]
    if spec.mesh.device_count % processes:
        fail(f"mesh of {spec.mesh.device_count} devices cannot be split over {processes} processes", ExitCode.USAGE)
    sharding.set_cpu_device_count(spec.mesh.device_count // processes)
    sharding.initialize_distributed(options.own["coordinator"], processes, options.own["process_id"])
    sharding.check_platform()  # a JAX_PLATFORMS this machine lacks: one line and exit 2, not a crash
    cache = enable_compile_cache(options.compile_cache)
    monitor = CompileMonitor()
    record, tensors = harness.run(lambda: make_trainer(spec, options, monitor), options, progress)
    record.compile_cache = monitor.cache_summary(cache)
    return record, tensors, jax.process_index() == 0


if __name__ == "__main__":
    exit_process(backend_main.main("jax_impl", sys.argv[1:], add_flags, train))

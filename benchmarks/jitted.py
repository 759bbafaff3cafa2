"""The measurement both jitted runtimes' overhead benchmarks share (the JAX twin and torchax): the
toolkit's loop step, the same trainer uninstrumented, and a minimal hand-written step,
interleaved."""

from __future__ import annotations

import json

from benchmarks.timing import interleaved, parse_args, ratio, summarize
from common.data import make_dataset
from common.presets import load_spec
from driver.harness import RunOptions
from jax_impl import sharding
from jax_impl.instrument import CompileMonitor


def measure(backend: str, description: str, make_trainer, minimal_loop) -> None:
    """Prints one JSON line: step ms per candidate and the two ratios, with compiles seen while
    timed. `make_trainer(spec, options, monitor)`: the runtime's own (jax_impl.train's,
    torchax_impl.train's)."""
    args = parse_args(description)
    spec = load_spec(args.spec)
    monitor = CompileMonitor()
    trainer = make_trainer(spec, RunOptions(checkpoint=args.checkpoint), monitor)
    batch = sharding.put_batch(make_dataset(spec).global_batch(0), spec.mesh, trainer.mesh)
    counter = iter(range(10**9))
    candidates = {
        "minimal": minimal_loop(spec, batch, args.checkpoint),
        "toolkit": lambda: trainer.timed_step(next(counter), batch),
        "uninstrumented": lambda: sharding.scalar_to_host(trainer.step(batch)),
    }
    for step in candidates.values():  # compile and warm up outside the measurement
        for _ in range(3):
            step()
    warm_compiles = len(monitor.events)
    hooks = {"minimal": monitor.close, "toolkit": monitor.install, "uninstrumented": monitor.close}
    samples = interleaved(candidates, args.rounds, args.steps_per_round, hooks)
    monitor.install()
    print(
        json.dumps(
            {
                "backend": backend,
                "spec": args.spec,
                "step_ms": summarize(samples),
                "ratios": {
                    "toolkit_over_minimal": ratio(samples, "toolkit", "minimal"),
                    "instrumented_over_uninstrumented": ratio(samples, "toolkit", "uninstrumented"),
                },
                "compiles_while_timed": len(monitor.events) - warm_compiles,
            }
        )
    )

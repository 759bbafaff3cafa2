"""The toolkit's JAX train step vs a minimal hand-written loop, and vs itself without instrumentation.

All candidates run the same Flax NNX model, weights, optimizer and batch in
this process, interleaved round by round:
- `minimal`: what a JAX user writes by hand: split the model once, one pure
  `jax.jit` step with donation, the loss read with `float()` after each step
  (every candidate produces the same output: a per-step loss on the host);
- `toolkit`: the loop body `compare` runs (`jax_impl.train.timed_step`) with
  the compile listeners and cache-miss logging installed;
- `uninstrumented`: the same trainer's step and loss copied to the host (the
  record needs it: that is training output, not instrumentation), with the
  compile listeners and cache-miss logging removed and no timing.
Prints one JSON line. Run: python -m benchmarks.overhead_jax --spec mlp-tiny
"""
from __future__ import annotations

import json

import jax
import optax
from flax import nnx

from benchmarks.timing import interleaved, parse_args, ratio, summarize
from common.data import make_dataset
from common.presets import load_spec
from common.weights import init_params
from jax_impl import convert, sharding
from jax_impl.instrument import CompileMonitor
from jax_impl.models import build_model
from jax_impl.optim import make_optimizer
from jax_impl.train import JaxTrainer, cross_entropy, timed_step


def minimal_loop(spec, batch):
    """The hand-written baseline: no instrumentation, no sharding annotations."""
    graphdef, abstract, rest = nnx.split(build_model(spec.model), nnx.Param, ...)
    params = convert.load_canonical(abstract, init_params(spec.model, spec.train.seed), spec.model)
    tx = make_optimizer(spec.train)
    opt_state = tx.init(params)

    def loss_fn(p, b):
        return cross_entropy(nnx.merge(graphdef, p, rest)(b.inputs), b.targets)

    def train_step(p, s, b):
        loss, grads = jax.value_and_grad(loss_fn)(p, b)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    step_fn = jax.jit(train_step, donate_argnums=(0, 1))
    state = {"p": params, "s": opt_state}

    def step():
        state["p"], state["s"], loss = step_fn(state["p"], state["s"], batch)
        float(loss)

    return step


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    spec = load_spec(args.spec)
    mesh = sharding.make_mesh(spec.mesh)
    batch = sharding.put_batch(make_dataset(spec).global_batch(0), spec.mesh, mesh)
    monitor = CompileMonitor()
    trainer = JaxTrainer(spec, mesh)
    counter = iter(range(10 ** 9))

    candidates = {
        "minimal": minimal_loop(spec, batch),
        "toolkit": lambda: timed_step(trainer, monitor, next(counter), batch),
        "uninstrumented": lambda: sharding.scalar_to_host(trainer.step(batch)),
    }
    for step in candidates.values():  # compile and warm up outside the measurement
        for _ in range(3):
            step()
    warm_compiles = len(monitor.events)
    hooks = {"minimal": monitor.close, "toolkit": monitor.install, "uninstrumented": monitor.close}
    samples = interleaved(candidates, args.rounds, args.steps_per_round, hooks)
    monitor.install()
    print(json.dumps({"backend": "jax", "spec": args.spec, "step_ms": summarize(samples), "ratios": {
        "toolkit_over_minimal": ratio(samples, "toolkit", "minimal"),
        "instrumented_over_uninstrumented": ratio(samples, "toolkit", "uninstrumented")},
        "compiles_while_timed": len(monitor.events) - warm_compiles}))


if __name__ == "__main__":
    main()

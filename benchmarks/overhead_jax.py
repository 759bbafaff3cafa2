"""The toolkit's JAX train step vs a minimal hand-written jax.jit + optax loop, side by side.

Both run the same Flax NNX model, weights, optimizer and batch in this process;
the minimal loop is what a JAX user writes by hand: split the model once, one
pure `jax.jit` step with donation, `block_until_ready` after each step.
Prints one JSON line. Run: python -m benchmarks.overhead_jax --spec mlp-tiny
"""
from __future__ import annotations

import json

import jax
import optax
from flax import nnx

from benchmarks.timing import interleaved, parse_args, summarize
from common.data import make_dataset
from common.spec import load_spec
from common.weights import init_params
from jax_impl import convert, sharding
from jax_impl.instrument import CompileMonitor
from jax_impl.models import build_model
from jax_impl.train import JaxTrainer, cross_entropy, make_optimizer


def minimal_loop(spec, batch):
    """The hand-written baseline: no instrumentation, no sharding annotations."""
    graphdef, abstract, rest = nnx.split(build_model(spec.model), nnx.Param, ...)
    params = convert.from_canonical(abstract, init_params(spec.model, spec.train.seed), spec.model)
    tx = make_optimizer(spec.train)
    opt_state = tx.init(params)

    @jax.jit
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
        loss.block_until_ready()

    return step


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    spec = load_spec(args.spec)
    mesh = sharding.make_mesh(spec.mesh)
    batch = sharding.put_batch(make_dataset(spec).global_batch(0), spec.mesh, mesh)
    CompileMonitor()  # the toolkit runs with its listeners installed
    trainer = JaxTrainer(spec, mesh)

    def toolkit():
        trainer.step(batch).block_until_ready()

    candidates = {"minimal": minimal_loop(spec, batch), "toolkit": toolkit}
    for step in candidates.values():  # compile and warm up outside the measurement
        for _ in range(3):
            step()
    result = summarize(interleaved(candidates, args.rounds, args.steps_per_round), baseline="minimal")
    print(json.dumps({"backend": "jax", "spec": args.spec, **result}))


if __name__ == "__main__":
    main()

"""The toolkit's JAX train step vs a minimal hand-written loop, and vs itself without
instrumentation.

All candidates run the same Flax NNX model, weights, optimizer and batch in
this process, interleaved round by round:
- `minimal`: what a JAX user writes by hand: split the model once, one pure
  `jax.jit` step with donation, the loss read with `float()` after each step
  (every candidate produces the same output: a per-step loss on the host);
- `toolkit`: the loop body `compare` runs (`JittedTrainer.timed_step`, jax_impl/loop.py) with
  the compile listeners and cache-miss logging installed;
- `uninstrumented`: the same trainer's step and loss copied to the host (the
  record needs it: that is training output, not instrumentation), with the
  compile listeners and cache-miss logging removed and no timing.
Prints one JSON line. Run: python -m benchmarks.overhead_jax --spec mlp-tiny
"""

from __future__ import annotations

import jax
import optax
from flax import nnx

from benchmarks.jitted import measure
from common.twin import twin_of
from common.twin.outputs import logits_of
from common.weights import start_params
from jax_impl import convert
from jax_impl.models import build_model, nnx_input_axes, nnx_inputs
from jax_impl.optim import make_optimizer
from jax_impl.train import cross_entropy, in_this_trace, make_trainer


def minimal_loop(spec, batch, checkpoint=None):
    """The hand-written baseline: no instrumentation, no sharding annotations; BatchNorm's running
    statistics (empty without a BatchNorm) threaded through the step as a hand-written NNX loop
    does."""
    graphdef, abstract, stats, rest = nnx.split(
        build_model(spec.model), nnx.Param, nnx.BatchStat, ...
    )
    params = convert.load_canonical(
        abstract, start_params(spec.model, spec.train.seed, checkpoint), spec.model
    )
    tx = make_optimizer(spec.train)
    opt_state = tx.init(params)
    # an NHWC port, a model with several outputs
    axes, which = nnx_input_axes(spec), twin_of(spec.model).logits

    def loss_fn(p, st, b):
        model = nnx.merge(graphdef, p, in_this_trace(st), rest)  # BatchNorm updates its statistics
        loss = cross_entropy(logits_of(model(nnx_inputs(b.inputs, axes)), which), b.targets)
        return loss, nnx.state(model, nnx.BatchStat)

    def train_step(p, st, s, b):
        (loss, st), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, st, b)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), st, s, loss

    step_fn = jax.jit(train_step, donate_argnums=(0, 1, 2))
    state = {"p": params, "st": stats, "s": opt_state}

    def step():
        state["p"], state["st"], state["s"], loss = step_fn(
            state["p"], state["st"], state["s"], batch
        )
        float(loss)

    return step


def main() -> None:
    measure("jax", __doc__.splitlines()[0], make_trainer, minimal_loop)


if __name__ == "__main__":
    main()

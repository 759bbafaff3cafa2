"""The toolkit's torchax train step vs a minimal hand-written loop, and vs itself without
instrumentation.

- `minimal`: what a torchax user writes, after torchax's own recipe: `torchax.extract_jax(model)`, a
  loss through `interop.call_torch`, optax, one `jax.jit` step with donation, the loss read with
  `float()`;
- `toolkit`: the loop body `compare` runs (`JittedTrainer.timed_step`, jax_impl/loop.py) with JAX's
  compile listeners and cache-miss logging installed;
- `uninstrumented`: the same trainer's step and loss on the host, listeners removed, no timing.
Prints one JSON line. Run: python -m benchmarks.overhead_torchax --spec mlp-tiny
"""

from __future__ import annotations

import jax
import optax
import torchax
from torchax import interop

from benchmarks.jitted import measure
from common.twin import twin_of
from common.twin.outputs import logits_of
from common.weights import start_params
from jax_impl.optim import make_optimizer
from torch_impl.convert import load_canonical
from torch_impl.models import build_model
from torch_impl.train import cross_entropy
from torchax_impl.train import make_trainer


def minimal_loop(spec, batch, checkpoint=None):
    model = load_canonical(
        build_model(spec.model), start_params(spec.model, spec.train.seed, checkpoint), spec.model
    )
    states, forward = torchax.extract_jax(model)
    trainable = dict(model.named_parameters())
    weights = {k: v for k, v in states.items() if k in trainable}
    # a rotary table, say: never trained
    buffers = {k: v for k, v in states.items() if k not in trainable}
    tx = make_optimizer(spec.train)

    which = twin_of(spec.model).logits  # a Hugging Face model returns a ModelOutput

    def loss_fn(w, b):
        return interop.call_torch(
            cross_entropy, logits_of(forward({**w, **buffers}, (b.inputs,)), which), b.targets
        )

    def train_step(w, s, b):
        loss, grads = jax.value_and_grad(loss_fn)(w, b)
        updates, s = tx.update(grads, s, w)
        return optax.apply_updates(w, updates), s, loss

    step_fn = jax.jit(train_step, donate_argnums=(0, 1))
    state = {"w": weights, "s": tx.init(weights)}

    def step():
        state["w"], state["s"], loss = step_fn(state["w"], state["s"], batch)
        float(loss)

    return step


def main() -> None:
    measure("torchax", __doc__.splitlines()[0], make_trainer, minimal_loop)


if __name__ == "__main__":
    main()

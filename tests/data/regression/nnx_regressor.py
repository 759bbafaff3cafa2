"""The Flax NNX port of `torch_regressor.py`, its own module names, and its loss written with optax.

optax's Huber loss with `delta` is torch's smooth L1 with `beta = delta` times `delta`: the faithful
port divides by delta; `huber_as_smooth_l1` is the usual mistake, optax's function taken for torch's
(twins.py).
"""

import optax
from flax import nnx

DELTA = 0.5  # torch_regressor.BETA


class Regressor(nnx.Module):
    def __init__(self, input_shape: int, hidden: int, num_outputs: int, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(input_shape, hidden, rngs=rngs)
        self.norm = nnx.LayerNorm(hidden, epsilon=1e-5, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, num_outputs, rngs=rngs)

    def __call__(self, x):
        x = nnx.gelu(self.norm(self.fc1(x)), approximate=False)
        return self.out(nnx.gelu(self.fc2(x), approximate=False))


def smooth_l1(outputs, batch):
    return (optax.huber_loss(outputs, batch["targets"], delta=DELTA) / DELTA).mean()


def huber_as_smooth_l1(outputs, batch):
    return optax.huber_loss(outputs, batch["targets"], delta=DELTA).mean()

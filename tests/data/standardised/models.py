"""A classifier that standardises its inputs by the statistics of its training data, held in
persistent buffers (a state_dict carries them), as many vision and audio models do; its update count
beside them. The NNX port holds them in a Variable of its own kind, as a port of such a model
would."""

import jax.numpy as jnp
import torch
from flax import nnx


class TorchStandardised(torch.nn.Module):
    def __init__(self, features, hidden, num_classes, **_):
        super().__init__()
        # the training data's, set by whoever trained it
        self.register_buffer("mean", torch.zeros(features))
        self.register_buffer("std", torch.ones(features))
        self.register_buffer("num_updates", torch.tensor(0))
        self.body = torch.nn.Sequential(
            torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, num_classes)
        )

    def forward(self, x):
        return self.body((x - self.mean) / self.std)


class Statistic(nnx.Variable):
    """A value the model holds and never trains (torch's register_buffer)."""


class NnxStandardised(nnx.Module):
    def __init__(self, features, hidden, num_classes, *, rngs, **_):
        self.mean = Statistic(jnp.zeros(features))
        self.std = Statistic(jnp.ones(features))
        self.num_updates = Statistic(jnp.asarray(0))
        self.body = nnx.Sequential(
            nnx.Linear(features, hidden, rngs=rngs),
            nnx.relu,
            nnx.Linear(hidden, num_classes, rngs=rngs),
        )

    def __call__(self, x):
        return self.body((x - self.mean.value) / self.std.value)


class NnxStandardisedMisported(NnxStandardised):
    # scaled by the std, not divided: the same model while the std is the factory's ones
    def __call__(self, x):
        return self.body((x - self.mean.value) * self.std.value)


class TorchRunningStandardised(TorchStandardised):
    """Standardises each training batch by its own mean and keeps an exponential moving average of
    it in `mean`, which eval mode uses, counting its updates: a normaliser written by hand, as
    BatchNorm's running mean is."""

    momentum = 0.1

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        batch_mean = x.mean(0)
        with torch.no_grad():
            self.mean.lerp_(batch_mean, self.momentum)
            self.num_updates += 1
        return self.body((x - batch_mean) / self.std)


class NnxRunningStandardised(NnxStandardised):
    momentum = 0.1

    def __init__(self, features, hidden, num_classes, *, rngs, **_):
        super().__init__(features, hidden, num_classes, rngs=rngs)
        # set by nnx.Module.train() and .eval(), as on nnx.BatchNorm
        self.use_running_average = False

    def __call__(self, x):
        if self.use_running_average:
            return super().__call__(x)
        batch_mean = x.mean(0)
        self.mean.value = self.mean.value + self.momentum * (batch_mean - self.mean.value)
        self.num_updates.value += 1
        return self.body((x - batch_mean) / self.std.value)


class NnxRunningStandardisedMisported(NnxRunningStandardised):
    # torch's momentum read in flax's convention (nnx.BatchNorm keeps `momentum` of the old)
    def __call__(self, x):
        if self.use_running_average:
            return NnxStandardised.__call__(self, x)
        batch_mean = x.mean(0)
        self.mean.value = self.momentum * self.mean.value + (1 - self.momentum) * batch_mean
        self.num_updates.value += 1
        return self.body((x - batch_mean) / self.std.value)

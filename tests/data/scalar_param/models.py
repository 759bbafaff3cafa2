"""A model with a learned scalar, as CLIP's logit_scale (a 0-d nn.Parameter / nnx.Param), written as
users do."""

import jax.numpy as jnp
import torch
from flax import nnx


class TorchScaled(torch.nn.Module):
    def __init__(self, features, num_classes, **_):
        super().__init__()
        self.proj = torch.nn.Linear(features, num_classes)
        self.logit_scale = torch.nn.Parameter(torch.tensor(2.6592))

    def forward(self, x):
        return self.proj(x) * self.logit_scale.exp()


class NnxScaled(nnx.Module):
    def __init__(self, features, num_classes, *, rngs, **_):
        self.proj = nnx.Linear(features, num_classes, rngs=rngs)
        self.logit_scale = nnx.Param(jnp.asarray(2.6592))

    def __call__(self, x):
        return self.proj(x) * jnp.exp(self.logit_scale.value)


class NnxScaledMisported(NnxScaled):
    def __call__(self, x):  # the scale applied without its exp
        return self.proj(x) * self.logit_scale.value

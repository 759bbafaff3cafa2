"""A small model that takes two named inputs, a feature vector and an integer condition, in torch and in NNX."""
import jax.numpy as jnp
import torch
from flax import nnx
from torch import nn


class TorchNet(nn.Module):
    def __init__(self, features: int, conditions: int):
        super().__init__()
        self.fc = nn.Linear(features, features)
        self.cond = nn.Embedding(conditions, features)

    def forward(self, x, c):
        return self.fc(x) + self.cond(c)


class NnxNet(nnx.Module):
    def __init__(self, features: int, conditions: int, *, rngs: nnx.Rngs):
        self.fc = nnx.Linear(features, features, rngs=rngs)
        self.cond = nnx.Embed(conditions, features, rngs=rngs)

    def __call__(self, x, c):
        return self.fc(x) + self.cond(c)


def torch_loss(outputs, batch):
    return torch.mean((outputs - batch["target"]) ** 2)


def nnx_loss(outputs, batch):
    return jnp.mean((outputs - batch["target"]) ** 2)

"""A small model that takes two named inputs, a feature vector and an integer condition, in torch
and in NNX."""

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


# a second output no loss reads, as a model's features or its auxiliary head
class TorchTwoOutputs(TorchNet):
    def forward(self, x, c):
        return {"logits": super().forward(x, c), "features": torch.tanh(self.fc(x))}


class NnxTwoOutputs(NnxNet):
    def __call__(self, x, c):
        return {"logits": super().__call__(x, c), "features": jnp.tanh(self.fc(x))}


# its features through another nonlinearity: the loss never sees it
class NnxTwoOutputsMisported(NnxNet):
    def __call__(self, x, c):
        return {"logits": super().__call__(x, c), "features": nnx.sigmoid(self.fc(x))}


def torch_logits_loss(outputs, batch):
    return torch_loss(outputs["logits"], batch)


def nnx_logits_loss(outputs, batch):
    return nnx_loss(outputs["logits"], batch)


def torch_loss_per_element(outputs, batch):
    return (outputs - batch["target"]) ** 2


def nnx_loss_per_element(outputs, batch):
    return (outputs - batch["target"]) ** 2


def torch_loss_int(outputs, batch):
    return torch.mean((outputs - batch["target"]) ** 2).round().long()


def nnx_loss_int(outputs, batch):
    return jnp.mean((outputs - batch["target"]) ** 2).round().astype(jnp.int32)


def loss_python_number(outputs, batch):
    return 1

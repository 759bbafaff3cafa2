"""A user's classifier whose head is padded to a round size and masks the padded class with -inf (as
a language model masks the padded entries of its vocabulary): its logits hold -inf on both sides, by
design."""

import jax.numpy as jnp
import torch
from flax import nnx
from torch import nn

PADDED = 1  # head entries past num_classes, never a label


class TorchNet(nn.Module):
    def __init__(self, input_shape: int, hidden: int, num_classes: int):
        super().__init__()
        self.fc1 = nn.Linear(input_shape, hidden)
        self.fc2 = nn.Linear(hidden, num_classes + PADDED)
        self.num_classes = num_classes

    def forward(self, x):
        logits = self.fc2(torch.relu(self.fc1(x)))
        keep = torch.arange(logits.shape[-1], device=logits.device) < self.num_classes
        return logits.masked_fill(~keep, float("-inf"))


class NnxNet(nnx.Module):
    def __init__(self, input_shape: int, hidden: int, num_classes: int, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(input_shape, hidden, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, num_classes + PADDED, rngs=rngs)
        self.num_classes = num_classes

    def __call__(self, x):
        logits = self.fc2(nnx.relu(self.fc1(x)))
        keep = jnp.arange(logits.shape[-1]) < self.num_classes
        return jnp.where(keep, logits, -jnp.inf)

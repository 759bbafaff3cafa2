"""A user's small upsampling classifier: a strided convolution down, torch's ConvTranspose2d back up
(as many channels out as in, so that its kernel's shape cannot tell its layout), a 1x1 convolution,
global average pooling and a Linear head; and its NHWC NNX port with nnx.ConvTranspose."""

import jax.numpy as jnp
import torch
from flax import nnx
from torch import nn


class TorchUpsampler(nn.Module):
    def __init__(self, input_shape, width, num_classes):
        super().__init__()
        self.down = nn.Conv2d(input_shape[0], width, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(width, width, 3, stride=2, padding=1, output_padding=1)
        self.mix = nn.Conv2d(width, width, 1)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):  # (B, C, H, W)
        x = torch.relu(self.up(torch.relu(self.down(x))))  # (B, width, H, W)
        return self.head(self.mix(x).mean((2, 3)))


class NnxUpsampler(nnx.Module):
    def __init__(self, input_shape, width, num_classes, *, rngs, up_padding=((1, 2), (1, 2))):
        self.down = nnx.Conv(
            input_shape[0], width, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)), rngs=rngs
        )
        # torch's padding p is Flax's k - 1 - p on each side, plus output_padding after
        self.up = nnx.ConvTranspose(
            width, width, (3, 3), strides=(2, 2), padding=up_padding, rngs=rngs
        )
        self.mix = nnx.Conv(width, width, (1, 1), rngs=rngs)
        self.head = nnx.Linear(width, num_classes, rngs=rngs)

    def __call__(self, x):  # (B, H, W, C)
        x = nnx.relu(self.up(nnx.relu(self.down(x))))
        return self.head(jnp.mean(self.mix(x), axis=(1, 2)))


def nnx_upsampler_torch_padding(input_shape, width, num_classes, *, rngs):
    """The mis-port: torch's padding=1 copied into nnx.ConvTranspose, where it means something
    else."""
    return NnxUpsampler(input_shape, width, num_classes, rngs=rngs, up_padding=1)

"""The Flax NNX port of `torch_resnet.py`, written the way JAX code is: channel-last (NHWC) images,
`nnx.Sequential` for the stages and the projection shortcut, `nnx.relu` as a function, a global mean
for the pooling. The twin feeds it NHWC (`nnx_input_axes`). Flax's BatchNorm `momentum` is the
weight of the old statistics (torch's 0.1 is Flax's 0.9).

`strided_padding` picks how a strided 3x3 convolution pads: "torch" (one pixel each side, as
`nn.Conv2d(padding=1)`) or "SAME" (XLA's: on an even input it pads only the bottom and right), the
classic mistake `twin.py:resnet_tiny_same_padding` makes; `bn_momentum=0.1`, torch's number copied
as it is, is the other (`twin.py:resnet_tiny_bn_momentum`).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


def _conv(n_in: int, n_out: int, size: int, stride: int, padding, rngs: nnx.Rngs) -> nnx.Conv:
    return nnx.Conv(
        n_in, n_out, (size, size), strides=stride, padding=padding, use_bias=False, rngs=rngs
    )


def _bn(n: int, momentum: float, rngs: nnx.Rngs) -> nnx.BatchNorm:
    return nnx.BatchNorm(n, momentum=momentum, epsilon=1e-5, rngs=rngs)


class BasicBlock(nnx.Module):
    def __init__(
        self,
        n_in: int,
        n_out: int,
        stride: int,
        strided_padding: str,
        bn_momentum: float,
        rngs: nnx.Rngs,
    ):
        padding = ((1, 1), (1, 1)) if stride == 1 or strided_padding == "torch" else "SAME"
        self.conv1 = _conv(n_in, n_out, 3, stride, padding, rngs)
        self.bn1 = _bn(n_out, bn_momentum, rngs)
        self.conv2 = _conv(n_out, n_out, 3, 1, ((1, 1), (1, 1)), rngs)
        self.bn2 = _bn(n_out, bn_momentum, rngs)
        projects = stride != 1 or n_in != n_out
        self.downsample = (
            nnx.Sequential(
                _conv(n_in, n_out, 1, stride, "VALID", rngs), _bn(n_out, bn_momentum, rngs)
            )
            if projects
            else None
        )

    def __call__(self, x):
        out = nnx.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return nnx.relu(out + shortcut)


class ResNet(nnx.Module):
    def __init__(
        self,
        layers=(1, 1, 1),
        widths=(16, 32, 64),
        num_classes: int = 10,
        in_channels: int = 3,
        *,
        strided_padding: str = "torch",
        bn_momentum: float = 0.9,
        rngs: nnx.Rngs,
    ):
        self.conv1 = _conv(in_channels, widths[0], 3, 1, ((1, 1), (1, 1)), rngs)
        self.bn1 = _bn(widths[0], bn_momentum, rngs)
        n_in, stages = widths[0], []
        for i, (n_out, blocks) in enumerate(zip(widths, layers)):
            stride = 1 if i == 0 else 2
            stage = [BasicBlock(n_in, n_out, stride, strided_padding, bn_momentum, rngs)]
            stage += [
                BasicBlock(n_out, n_out, 1, strided_padding, bn_momentum, rngs)
                for _ in range(1, blocks)
            ]
            stages.append(nnx.Sequential(*stage))
            n_in = n_out
        self.layer1, self.layer2, self.layer3 = stages
        self.fc = nnx.Linear(widths[-1], num_classes, rngs=rngs)

    def __call__(self, x):  # x: (N, H, W, C)
        x = nnx.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(jnp.mean(x, axis=(1, 2)))


def resnet(
    input_shape=(3, 16, 16),
    layers=(1, 1, 1),
    widths=(16, 32, 64),
    num_classes: int = 10,
    *,
    rngs: nnx.Rngs,
    strided_padding: str = "torch",
    bn_momentum: float = 0.9,
) -> ResNet:
    """The factory the twin names: the channels from the task's (C, H, W) images."""
    return ResNet(
        layers,
        widths,
        num_classes,
        in_channels=input_shape[0],
        strided_padding=strided_padding,
        bn_momentum=bn_momentum,
        rngs=rngs,
    )


def resnet_same_padding(*, rngs: nnx.Rngs, **hparams) -> ResNet:
    """The mis-port: strided convolutions padded "SAME" (XLA's), where torch pads one pixel each
    side."""
    return resnet(**hparams, rngs=rngs, strided_padding="SAME")


def resnet_torch_momentum(*, rngs: nnx.Rngs, **hparams) -> ResNet:
    """The mis-port: torch's `momentum=0.1` copied as it is, where Flax's momentum weighs the old
    statistics."""
    return resnet(**hparams, rngs=rngs, bn_momentum=0.1)

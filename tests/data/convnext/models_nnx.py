"""An idiomatic Flax NNX port of the tiny ConvNeXt: NHWC throughout (written by a new user from the
README; `block_eps` and `tanh_gelu` only for the tests' mis-ports: ConvNeXt's blocks normalize with
1e-6, torch's LayerNorm default 1e-5; torchvision's GELU is exact)."""

import jax.numpy as jnp
from flax import nnx


class Block(nnx.Module):
    def __init__(self, dim, layer_scale, eps=1e-6, tanh_gelu=False, *, rngs):
        self.tanh_gelu = tanh_gelu
        self.dwconv = nnx.Conv(
            dim, dim, kernel_size=(7, 7), padding=3, feature_group_count=dim, rngs=rngs
        )
        self.norm = nnx.LayerNorm(dim, epsilon=eps, rngs=rngs)
        self.pwconv1 = nnx.Linear(dim, 4 * dim, rngs=rngs)
        self.pwconv2 = nnx.Linear(4 * dim, dim, rngs=rngs)
        self.gamma = nnx.Param(jnp.full((dim,), layer_scale, jnp.float32))

    def __call__(self, x):
        y = self.dwconv(x)
        y = self.norm(y)
        y = self.pwconv1(y)
        y = nnx.gelu(y, approximate=self.tanh_gelu)
        y = self.pwconv2(y)
        return x + self.gamma[...] * y


class Downsample(nnx.Module):
    def __init__(self, cin, cout, *, rngs):
        self.norm = nnx.LayerNorm(cin, epsilon=1e-6, rngs=rngs)
        self.conv = nnx.Conv(
            cin, cout, kernel_size=(2, 2), strides=(2, 2), padding="VALID", rngs=rngs
        )

    def __call__(self, x):
        return self.conv(self.norm(x))


class ConvNeXt(nnx.Module):
    def __init__(
        self,
        input_shape=(3, 32, 32),
        num_classes=10,
        dims=(16, 32),
        depths=(1, 1),
        layer_scale=0.1,
        stochastic_depth_prob=0.0,
        block_eps=1e-6,
        tanh_gelu=False,
        *,
        rngs,
    ):
        in_ch = input_shape[0]
        self.stem_conv = nnx.Conv(
            in_ch, dims[0], kernel_size=(4, 4), strides=(4, 4), padding="VALID", rngs=rngs
        )
        self.stem_norm = nnx.LayerNorm(dims[0], epsilon=1e-6, rngs=rngs)
        self.stages = nnx.List(
            [
                nnx.Sequential(
                    *[Block(d, layer_scale, block_eps, tanh_gelu, rngs=rngs) for _ in range(n)]
                )
                for d, n in zip(dims, depths)
            ]
        )
        self.downsamples = nnx.List(
            [Downsample(dims[i], dims[i + 1], rngs=rngs) for i in range(len(dims) - 1)]
        )
        self.norm = nnx.LayerNorm(dims[-1], epsilon=1e-6, rngs=rngs)
        self.head = nnx.Linear(dims[-1], num_classes, rngs=rngs)

    def __call__(self, x):  # x: (B, H, W, C)
        x = self.stem_norm(self.stem_conv(x))
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i < len(self.downsamples):
                x = self.downsamples[i](x)
        x = x.mean(axis=(1, 2))
        return self.head(self.norm(x))


def convnext_block_eps_misported(**hparams):
    """The mis-port: the blocks' LayerNorm at torch's default epsilon."""
    return ConvNeXt(**hparams, block_eps=1e-5)


def convnext_tanh_gelu(**hparams):
    """The mis-port: flax's default GELU, the tanh approximation (torchvision's is exact): within
    float32's bounds at init, found in float64."""
    return ConvNeXt(**hparams, tanh_gelu=True)

"""The Flax NNX port of `torch_unet.py`, written the way JAX code is: channel-last (NHWC) images,
`nnx.silu` as a function, its own module names: `time_mlp` (dense1, dense2), `stem`, `encoder` /
`decoder` lists of levels each holding its `res` block and its `resample` (None where there is
none), `middle`, `head_norm`, `head`; in a block `gn_a`, `conv_a`, `time_proj`, `gn_b`, `conv_b`,
`shortcut`.

What the port has to get right: GroupNorm's epsilon is torch's 1e-5, set explicitly (Flax's default
is 1e-6); the stride-2 downsampling conv pads one pixel each side, ((1, 1), (1, 1)), as torch's
padding=1 (XLA's "SAME" pads only the bottom and right of an even input); the upsampler is an
`nnx.ConvTranspose` with Flax's default `transpose_kernel=False` and padding k - 1 - p = 2 on each
side, which equals torch's ConvTranspose2d(k=4, s=2, p=1) once torch's weight (in, out, kH, kW) is
copied spatially flipped, `w[:, :, ::-1, ::-1].transpose(2, 3, 0, 1)` (torch correlates with the
flipped kernel, `lax.conv_transpose` with the kernel as it is). Skips are concatenated after the
running activation, as torch's cat([h, skip]).

The factories below the model are the mis-ports: "SAME" padding on the downsampling conv, and Flax's
GroupNorm epsilon (1e-6) left in place.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from flax import nnx

TORCH_PAD = ((1, 1), (1, 1))


def _conv(
    n_in: int, n_out: int, size: int, rngs: nnx.Rngs, stride: int = 1, padding=TORCH_PAD
) -> nnx.Conv:
    return nnx.Conv(n_in, n_out, (size, size), strides=stride, padding=padding, rngs=rngs)


def sinusoidal_embedding(t, dim: int):
    """(B,) int -> (B, dim) in JAX's default float (float32; float64 with x64, a float64 run): sin |
    cos of t * exp(-log(10000) * i / (half - 1)), as DDPM."""
    half, dtype = dim // 2, jnp.result_type(float)
    freqs = jnp.exp(jnp.arange(half, dtype=dtype) * (-math.log(10000.0) / (half - 1)))
    args = t.astype(dtype)[:, None] * freqs[None, :]
    return jnp.concatenate([jnp.sin(args), jnp.cos(args)], axis=-1)


class TimeMLP(nnx.Module):
    def __init__(self, dim: int, hidden: int, rngs: nnx.Rngs):
        self.dim = dim
        self.dense1 = nnx.Linear(dim, hidden, rngs=rngs)
        self.dense2 = nnx.Linear(hidden, hidden, rngs=rngs)

    def __call__(self, t):
        return self.dense2(nnx.silu(self.dense1(sinusoidal_embedding(t, self.dim))))


class ResBlock(nnx.Module):
    def __init__(self, n_in: int, n_out: int, n_time: int, groups: int, eps: float, rngs: nnx.Rngs):
        self.gn_a = nnx.GroupNorm(n_in, num_groups=groups, epsilon=eps, rngs=rngs)
        self.conv_a = _conv(n_in, n_out, 3, rngs)
        self.time_proj = nnx.Linear(n_time, n_out, rngs=rngs)
        self.gn_b = nnx.GroupNorm(n_out, num_groups=groups, epsilon=eps, rngs=rngs)
        self.conv_b = _conv(n_out, n_out, 3, rngs)
        self.shortcut = _conv(n_in, n_out, 1, rngs, padding="VALID") if n_in != n_out else None

    def __call__(self, x, temb):  # x (B, H, W, C), temb (B, n_time)
        h = self.conv_a(nnx.silu(self.gn_a(x)))
        h = h + self.time_proj(temb)[:, None, None, :]
        h = self.conv_b(nnx.silu(self.gn_b(h)))
        return h + (x if self.shortcut is None else self.shortcut(x))


class Level(nnx.Module):
    def __init__(self, res: ResBlock, resample: nnx.Module | None):
        self.res, self.resample = res, resample


class UNet(nnx.Module):
    def __init__(
        self,
        in_channels: int,
        base_width: int,
        channel_mults,
        groups: int,
        *,
        down_padding=TORCH_PAD,
        gn_eps: float = 1e-5,
        rngs: nnx.Rngs,
    ):
        n_time = 4 * base_width
        self.time_mlp = TimeMLP(base_width, n_time, rngs)
        self.stem = _conv(in_channels, base_width, 3, rngs)
        widths = [base_width * m for m in channel_mults]
        encoder, n = [], base_width
        for i, w in enumerate(widths):
            down = (
                _conv(w, w, 3, rngs, stride=2, padding=down_padding)
                if i < len(widths) - 1
                else None
            )
            encoder.append(Level(ResBlock(n, w, n_time, groups, gn_eps, rngs), down))
            n = w
        self.encoder = nnx.List(encoder)
        self.middle = ResBlock(n, n, n_time, groups, gn_eps, rngs)
        decoder = []
        for i, w in reversed(list(enumerate(widths))):
            up = (
                nnx.ConvTranspose(w, w, (4, 4), strides=2, padding=((2, 2), (2, 2)), rngs=rngs)
                if i > 0
                else None
            )
            decoder.append(Level(ResBlock(n + w, w, n_time, groups, gn_eps, rngs), up))
            n = w
        self.decoder = nnx.List(decoder)
        self.head_norm = nnx.GroupNorm(n, num_groups=groups, epsilon=gn_eps, rngs=rngs)
        self.head = _conv(n, in_channels, 3, rngs)

    def __call__(self, x, t):  # x (B, H, W, C), t (B,) int -> (B, H, W, C)
        temb = self.time_mlp(t)
        h, skips = self.stem(x), []
        for level in self.encoder:
            h = level.res(h, temb)
            skips.append(h)
            h = h if level.resample is None else level.resample(h)
        h = self.middle(h, temb)
        for level in self.decoder:
            h = level.res(jnp.concatenate([h, skips.pop()], axis=-1), temb)
            h = h if level.resample is None else level.resample(h)
        return self.head(nnx.silu(self.head_norm(h)))


def unet(
    in_channels: int = 3,
    image_size: int = 16,
    base_width: int = 16,
    channel_mults=(1, 2),
    groups: int = 8,
    *,
    rngs: nnx.Rngs,
    down_padding=TORCH_PAD,
    gn_eps: float = 1e-5,
) -> UNet:
    """The factory: `image_size` only checks that every level halves it evenly."""
    assert image_size % 2 ** (len(channel_mults) - 1) == 0, (image_size, channel_mults)
    return UNet(
        in_channels,
        base_width,
        tuple(channel_mults),
        groups,
        down_padding=down_padding,
        gn_eps=gn_eps,
        rngs=rngs,
    )


def mse_loss(outputs, batch):
    """Mean squared error, in float32, between the predicted noise and batch["noise"], both in one
    layout (the batch's NCHW: transpose the port's NHWC output back first)."""
    dtype = jnp.promote_types(outputs.dtype, jnp.float32)  # float64 in a float64 run
    return jnp.mean(jnp.square(outputs.astype(dtype) - jnp.asarray(batch["noise"], dtype)))


def unet_same_padding_down(*, rngs: nnx.Rngs, **hparams) -> UNet:
    """The mis-port: the downsampling conv padded "SAME" (XLA's: bottom/right only on an even
    input)."""
    return unet(**hparams, rngs=rngs, down_padding="SAME")


def unet_groupnorm_eps(*, rngs: nnx.Rngs, **hparams) -> UNet:
    """The mis-port: Flax's GroupNorm epsilon (1e-6) left in place of torch's 1e-5."""
    return unet(**hparams, rngs=rngs, gn_eps=1e-6)

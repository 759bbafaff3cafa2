"""The Flax NNX port of `torch_vit.py`, written the way JAX code is: NHWC images,
`nnx.MultiHeadAttention` (its query/key/value kernels (E, heads, head_dim): the toolkit reshapes
torch's packed `in_proj`), `nnx.Sequential` for the MLP with the activation as a function,
`nnx.List` for the blocks.

`gelu` picks the activation: "exact" (erf, torch's `nn.GELU()` default) or "tanh", which is Flax's
`nnx.gelu` default (`approximate=True`): the mis-port `twin.py:vit_tiny_tanh_gelu` makes.
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
from flax import nnx


class EncoderBlock(nnx.Module):
    def __init__(self, num_heads: int, hidden_dim: int, mlp_dim: int, gelu: str, rngs: nnx.Rngs):
        self.ln_1 = nnx.LayerNorm(hidden_dim, epsilon=1e-6, rngs=rngs)
        self.self_attention = nnx.MultiHeadAttention(
            num_heads=num_heads, in_features=hidden_dim, decode=False, rngs=rngs
        )
        self.ln_2 = nnx.LayerNorm(hidden_dim, epsilon=1e-6, rngs=rngs)
        activation = partial(nnx.gelu, approximate=False) if gelu == "exact" else nnx.gelu
        self.mlp = nnx.Sequential(
            nnx.Linear(hidden_dim, mlp_dim, rngs=rngs),
            activation,
            nnx.Linear(mlp_dim, hidden_dim, rngs=rngs),
        )

    def __call__(self, x):
        x = x + self.self_attention(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Encoder(nnx.Module):
    def __init__(
        self,
        seq_length: int,
        num_layers: int,
        num_heads: int,
        hidden_dim: int,
        mlp_dim: int,
        gelu: str,
        rngs: nnx.Rngs,
    ):
        self.pos_embedding = nnx.Param(
            nnx.initializers.normal(0.02)(rngs.params(), (1, seq_length, hidden_dim))
        )
        self.layers = nnx.List(
            [EncoderBlock(num_heads, hidden_dim, mlp_dim, gelu, rngs) for _ in range(num_layers)]
        )
        self.ln = nnx.LayerNorm(hidden_dim, epsilon=1e-6, rngs=rngs)

    def __call__(self, x):
        x = x + self.pos_embedding[...]
        for layer in self.layers:
            x = layer(x)
        return self.ln(x)


class VisionTransformer(nnx.Module):
    def __init__(
        self,
        image_size: int,
        patch_size: int,
        num_layers: int,
        num_heads: int,
        hidden_dim: int,
        mlp_dim: int,
        num_classes: int,
        in_channels: int = 3,
        *,
        gelu: str = "exact",
        rngs: nnx.Rngs,
    ):
        self.conv_proj = nnx.Conv(
            in_channels,
            hidden_dim,
            (patch_size, patch_size),
            strides=patch_size,
            padding="VALID",
            rngs=rngs,
        )
        self.class_token = nnx.Param(jnp.zeros((1, 1, hidden_dim)))
        seq_length = (image_size // patch_size) ** 2 + 1
        self.encoder = Encoder(seq_length, num_layers, num_heads, hidden_dim, mlp_dim, gelu, rngs)
        self.head = nnx.Linear(hidden_dim, num_classes, rngs=rngs)

    def __call__(self, x):  # x: (N, H, W, C)
        x = self.conv_proj(x)
        x = x.reshape(x.shape[0], -1, x.shape[-1])  # (N, h * w, hidden_dim), rows first as torch's
        token = jnp.broadcast_to(self.class_token[...], (x.shape[0], 1, x.shape[-1]))
        x = self.encoder(jnp.concatenate([token, x], axis=1))
        return self.head(x[:, 0])


def vit(
    input_shape=(3, 16, 16),
    patch_size=4,
    num_layers=2,
    num_heads=4,
    hidden_dim=32,
    mlp_dim=64,
    num_classes=10,
    *,
    rngs: nnx.Rngs,
    gelu: str = "exact",
) -> VisionTransformer:
    return VisionTransformer(
        input_shape[1],
        patch_size,
        num_layers,
        num_heads,
        hidden_dim,
        mlp_dim,
        num_classes,
        in_channels=input_shape[0],
        gelu=gelu,
        rngs=rngs,
    )


def vit_tanh_gelu(*, rngs: nnx.Rngs, **hparams) -> VisionTransformer:
    """The mis-port: Flax's default GELU (the tanh approximation) where torch's is exact."""
    return vit(**hparams, rngs=rngs, gelu="tanh")

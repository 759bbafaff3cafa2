"""Flax NNX port of Wav2Vec2ForSequenceClassification (group-norm feature encoder, post-LN
encoder)."""

import jax
import jax.numpy as jnp
from flax import nnx


def gelu(x):
    return jax.nn.gelu(x, approximate=False)


class ConvBlock(nnx.Module):
    def __init__(
        self, cin, cout, kernel, stride, *, group_norm=False, norm_groups=None, norm_eps=1e-5, rngs
    ):
        self.conv = nnx.Conv(
            cin,
            cout,
            kernel_size=(kernel,),
            strides=(stride,),
            padding="VALID",
            use_bias=False,
            rngs=rngs,
        )
        self.norm = (
            nnx.GroupNorm(cout, num_groups=norm_groups or cout, epsilon=norm_eps, rngs=rngs)
            if group_norm
            else None
        )

    def __call__(self, x):
        x = self.conv(x)
        if self.norm is not None:
            x = self.norm(x)
        return gelu(x)


class FeatureEncoder(nnx.Module):
    def __init__(
        self, conv_dim, conv_kernel, conv_stride, *, norm_groups=None, norm_eps=1e-5, rngs
    ):
        blocks, cin = [], 1
        for i, (c, k, s) in enumerate(zip(conv_dim, conv_kernel, conv_stride)):
            blocks.append(
                ConvBlock(
                    cin,
                    c,
                    k,
                    s,
                    group_norm=(i == 0),
                    norm_groups=norm_groups,
                    norm_eps=norm_eps,
                    rngs=rngs,
                )
            )
            cin = c
        self.convs = nnx.List(blocks)

    def __call__(self, audio):  # (B, T) -> (B, L, C)
        x = audio[..., None]
        for block in self.convs:
            x = block(x)
        return x


class FeatureProjection(nnx.Module):
    def __init__(self, cin, hidden, *, rngs):
        self.norm = nnx.LayerNorm(cin, epsilon=1e-5, rngs=rngs)
        self.dense = nnx.Linear(cin, hidden, rngs=rngs)

    def __call__(self, x):
        return self.dense(self.norm(x))


class WeightNormConv(nnx.Module):
    """Grouped 1-D conv with weight norm written out: w = g * v / ||v||, norm over (in, out) per
    tap.

    v is (K, C/G, C) (Flax's WIO), g is (K,). Padding K//2 both sides, then the trailing step
    trimmed (HF's SamePad) when K is even; GELU after.
    """

    def __init__(self, channels, kernel, groups, *, norm_axes=(1, 2), trim="end", rngs):
        key = rngs.params()
        v = jax.random.normal(key, (kernel, channels // groups, channels)) * 0.02
        self.v = nnx.Param(v)
        self.g = nnx.Param(jnp.sqrt(jnp.sum(v * v, axis=(1, 2))))
        self.bias = nnx.Param(jnp.zeros((channels,)))
        self.kernel, self.groups = kernel, groups
        self.norm_axes, self.trim = norm_axes, trim

    def __call__(self, x):  # (B, L, C)
        v = self.v[...]
        norm = jnp.sqrt(jnp.sum(v * v, axis=self.norm_axes, keepdims=True))
        w = self.g[...].reshape(-1, 1, 1) * v / norm
        pad = self.kernel // 2
        y = jax.lax.conv_general_dilated(
            x,
            w,
            window_strides=(1,),
            padding=[(pad, pad)],
            dimension_numbers=("NWC", "WIO", "NWC"),
            feature_group_count=self.groups,
        )
        y = y + self.bias[...]
        if self.kernel % 2 == 0:
            if self.trim == "end":
                y = y[:, :-1]
            elif self.trim == "start":
                y = y[:, 1:]
        return gelu(y)


class Attention(nnx.Module):
    def __init__(self, hidden, heads, *, rngs):
        self.query = nnx.Linear(hidden, hidden, rngs=rngs)
        self.key = nnx.Linear(hidden, hidden, rngs=rngs)
        self.value = nnx.Linear(hidden, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, hidden, rngs=rngs)
        self.heads = heads

    def __call__(self, x):
        b, t, e = x.shape
        d = e // self.heads
        split = lambda y: y.reshape(b, t, self.heads, d)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (d**-0.5)
        probs = jax.nn.softmax(scores, axis=-1)
        ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, t, e)
        return self.out(ctx)


class FeedForward(nnx.Module):
    def __init__(self, hidden, inner, *, approximate_gelu=False, rngs):
        self.fc1 = nnx.Linear(hidden, inner, rngs=rngs)
        self.fc2 = nnx.Linear(inner, hidden, rngs=rngs)
        self.approximate_gelu = approximate_gelu

    def __call__(self, x):
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=self.approximate_gelu))


class EncoderLayer(nnx.Module):
    def __init__(self, hidden, heads, inner, *, approximate_gelu=False, rngs):
        self.attn = Attention(hidden, heads, rngs=rngs)
        self.attn_norm = nnx.LayerNorm(hidden, epsilon=1e-5, rngs=rngs)
        self.mlp = FeedForward(hidden, inner, approximate_gelu=approximate_gelu, rngs=rngs)
        self.mlp_norm = nnx.LayerNorm(hidden, epsilon=1e-5, rngs=rngs)

    def __call__(self, x):  # post-LN, as HF's do_stable_layer_norm=False
        x = self.attn_norm(x + self.attn(x))
        return self.mlp_norm(x + self.mlp(x))


class Encoder(nnx.Module):
    def __init__(
        self,
        hidden,
        layers,
        heads,
        inner,
        pos_kernel,
        pos_groups,
        *,
        approximate_gelu=False,
        wn_axes=(1, 2),
        pos_trim="end",
        rngs,
    ):
        self.pos_conv = WeightNormConv(
            hidden, pos_kernel, pos_groups, norm_axes=wn_axes, trim=pos_trim, rngs=rngs
        )
        self.norm = nnx.LayerNorm(hidden, epsilon=1e-5, rngs=rngs)
        self.layers = nnx.List(
            [
                EncoderLayer(hidden, heads, inner, approximate_gelu=approximate_gelu, rngs=rngs)
                for _ in range(layers)
            ]
        )

    def __call__(self, x):
        x = self.norm(x + self.pos_conv(x))
        for layer in self.layers:
            x = layer(x)
        return x


class ClassifierHead(nnx.Module):
    def __init__(self, hidden, proj, classes, *, rngs):
        self.proj = nnx.Linear(hidden, proj, rngs=rngs)
        self.out = nnx.Linear(proj, classes, rngs=rngs)

    def __call__(self, x):
        return self.out(self.proj(x).mean(axis=1))


class Wav2Vec2Classifier(nnx.Module):
    def __init__(
        self,
        input_shape,
        num_classes,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        intermediate_size=64,
        conv_dim=(16, 16),
        conv_kernel=(10, 3),
        conv_stride=(5, 2),
        pos_kernel=16,
        pos_groups=4,
        proj_size=16,
        *,
        approximate_gelu=False,
        wn_axes=(1, 2),
        norm_groups=None,
        norm_eps=1e-5,
        pos_trim="end",
        rngs,
    ):
        self.feature_encoder = FeatureEncoder(
            conv_dim,
            conv_kernel,
            conv_stride,
            norm_groups=norm_groups,
            norm_eps=norm_eps,
            rngs=rngs,
        )
        self.feature_proj = FeatureProjection(conv_dim[-1], hidden_size, rngs=rngs)
        self.encoder = Encoder(
            hidden_size,
            num_layers,
            num_heads,
            intermediate_size,
            pos_kernel,
            pos_groups,
            approximate_gelu=approximate_gelu,
            wn_axes=wn_axes,
            pos_trim=pos_trim,
            rngs=rngs,
        )
        self.head = ClassifierHead(hidden_size, proj_size, num_classes, rngs=rngs)

    def __call__(self, audio):  # (B, T) float32 -> (B, num_classes)
        return self.head(self.encoder(self.feature_proj(self.feature_encoder(audio))))


def wav2vec2_cls(**hp):
    return Wav2Vec2Classifier(**hp)


# deliberate mis-ports
def misport_tanh_gelu(**hp):
    return Wav2Vec2Classifier(approximate_gelu=True, **hp)


def misport_wn_axis(**hp):
    # norm over (taps, in) per output channel: torch's default dim=0, not HF's dim=2
    return Wav2Vec2Classifier(wn_axes=(0, 1), **hp)


def misport_groupnorm(**hp):
    return Wav2Vec2Classifier(norm_groups=1, **hp)


def misport_samepad(**hp):
    return Wav2Vec2Classifier(pos_trim="start", **hp)


def misport_gn_eps(**hp):
    return Wav2Vec2Classifier(norm_eps=1e-6, **hp)  # Flax's default epsilon, not torch's 1e-5

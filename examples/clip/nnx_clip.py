"""A Flax NNX port of CLIP, in the usual JAX style: NHWC images, module names of its own (`text`,
`vision`, `attn`, `final_norm`, `patch`), each tower returning its pooled vector alone (the text's
at each caption's first EOS token, the image's at its class token), the projections and the 0-d
`logit_scale` at the top. The forward returns {"logits_per_image", "logits_per_text"}, as Hugging
Face's CLIPOutput names them.

The factories below the model are the mis-ports `twin.py` checks: the text embeddings not normalised
before the logits, and the text pooled at its first position (BOS, as a BERT-style [CLS] pooling
would) instead of the EOS token.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx


def quick_gelu(x):
    return x * jax.nn.sigmoid(1.702 * x)


class Attention(nnx.Module):
    def __init__(self, d_model: int, n_heads: int, rngs: nnx.Rngs):
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nnx.Linear(d_model, d_model, rngs=rngs) for _ in range(4)
        )

    # x (B, T, D); mask (B, 1, T, T) True where a query may attend
    def __call__(self, x, mask=None):
        b, t, _ = x.shape
        q, k, v = (
            p(x).reshape(b, t, self.n_heads, self.head_dim)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        scores = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
        probs = jax.nn.softmax(scores, axis=-1)
        return self.out_proj(jnp.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, -1))


class EncoderLayer(nnx.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int, rngs: nnx.Rngs):
        self.layer_norm1 = nnx.LayerNorm(d_model, epsilon=1e-5, rngs=rngs)
        self.attn = Attention(d_model, n_heads, rngs)
        self.layer_norm2 = nnx.LayerNorm(d_model, epsilon=1e-5, rngs=rngs)
        self.fc1, self.fc2 = (
            nnx.Linear(d_model, d_ff, rngs=rngs),
            nnx.Linear(d_ff, d_model, rngs=rngs),
        )

    def __call__(self, x, mask=None):
        x = x + self.attn(self.layer_norm1(x), mask)
        return x + self.fc2(quick_gelu(self.fc1(self.layer_norm2(x))))


class TextTower(nnx.Module):
    def __init__(
        self,
        vocab_size,
        seq_len,
        d_model,
        n_layers,
        n_heads,
        d_ff,
        rngs: nnx.Rngs,
        pool_first=False,
    ):
        self.token_embedding = nnx.Embed(vocab_size, d_model, rngs=rngs)
        self.position_embedding = nnx.Embed(seq_len, d_model, rngs=rngs)
        self.layers = nnx.List(
            [EncoderLayer(d_model, n_heads, d_ff, rngs) for _ in range(n_layers)]
        )
        self.final_norm = nnx.LayerNorm(d_model, epsilon=1e-5, rngs=rngs)
        self.eos, self.pool_first = vocab_size - 1, pool_first

    def __call__(self, ids, attention_mask):  # (B, T) ints -> (B, D), pooled
        t = ids.shape[1]
        x = self.token_embedding(ids) + self.position_embedding(jnp.arange(t))[None]
        mask = jnp.tril(jnp.ones((t, t), bool))[None, None] & (attention_mask[:, None, None, :] > 0)
        for layer in self.layers:
            x = layer(x, mask)
        x = self.final_norm(x)
        if self.pool_first:
            return x[:, 0]
        return x[jnp.arange(x.shape[0]), jnp.argmax(ids == self.eos, axis=-1)]


class VisionTower(nnx.Module):
    def __init__(self, image_size, patch_size, d_model, n_layers, n_heads, d_ff, rngs: nnx.Rngs):
        self.patch = nnx.Conv(
            3,
            d_model,
            (patch_size, patch_size),
            strides=patch_size,
            padding="VALID",
            use_bias=False,
            rngs=rngs,
        )
        self.class_embedding = nnx.Param(jax.random.normal(rngs.params(), (d_model,)))
        self.position_embedding = nnx.Embed((image_size // patch_size) ** 2 + 1, d_model, rngs=rngs)
        self.pre_norm = nnx.LayerNorm(d_model, epsilon=1e-5, rngs=rngs)
        self.layers = nnx.List(
            [EncoderLayer(d_model, n_heads, d_ff, rngs) for _ in range(n_layers)]
        )
        self.post_norm = nnx.LayerNorm(d_model, epsilon=1e-5, rngs=rngs)

    def __call__(self, images):  # (B, H, W, 3) -> (B, D), pooled at the class token
        patches = self.patch(images)
        b, d = patches.shape[0], patches.shape[-1]
        x = jnp.concatenate(
            [jnp.broadcast_to(self.class_embedding[...], (b, 1, d)), patches.reshape(b, -1, d)], 1
        )
        x = self.pre_norm(x + self.position_embedding(jnp.arange(x.shape[1]))[None])
        for layer in self.layers:
            x = layer(x)
        return self.post_norm(x[:, 0])


class CLIP(nnx.Module):
    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        image_size: int,
        patch_size: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        d_ff: int,
        embed_dim: int,
        *,
        rngs: nnx.Rngs,
        normalise_text=True,
        pool_first=False,
        one_directional=False,
    ):
        self.text = TextTower(
            vocab_size, seq_len, d_model, n_layers, n_heads, d_ff, rngs, pool_first
        )
        self.vision = VisionTower(image_size, patch_size, d_model, n_layers, n_heads, d_ff, rngs)
        self.text_projection = nnx.Linear(d_model, embed_dim, use_bias=False, rngs=rngs)
        self.visual_projection = nnx.Linear(d_model, embed_dim, use_bias=False, rngs=rngs)
        self.logit_scale = nnx.Param(jnp.asarray(math.log(1 / 0.07), jnp.float32))
        self.normalise_text, self.one_directional = normalise_text, one_directional

    def __call__(self, input_ids, pixel_values, attention_mask, return_loss=False):
        text = self.text_projection(self.text(input_ids, attention_mask))
        image = self.visual_projection(self.vision(pixel_values))
        image = image / jnp.linalg.norm(image, axis=-1, keepdims=True)
        if self.normalise_text:
            text = text / jnp.linalg.norm(text, axis=-1, keepdims=True)
        logits_per_text = text @ image.T * jnp.exp(self.logit_scale[...])
        out = {"logits_per_image": logits_per_text.T, "logits_per_text": logits_per_text}
        if not return_loss:
            return out
        # as CLIPModel(return_loss=True): each caption's cross-entropy over the images, each image's
        # over captions
        labels = jnp.arange(logits_per_text.shape[0])
        per_text = optax.softmax_cross_entropy_with_integer_labels(logits_per_text, labels).mean()
        per_image = optax.softmax_cross_entropy_with_integer_labels(
            logits_per_text.T, labels
        ).mean()
        return {"loss": per_image if self.one_directional else (per_text + per_image) / 2, **out}


def clip_text_not_normalised(**hparams) -> CLIP:
    """The mis-port: the text embeddings used as projected, not L2-normalised as the image ones
    are."""
    return CLIP(**hparams, normalise_text=False)


def clip_pooled_first(**hparams) -> CLIP:
    """The mis-port: each caption pooled at its first position (its BOS token), not at its first EOS
    token."""
    return CLIP(**hparams, pool_first=True)


def clip_loss_one_directional(**hparams) -> CLIP:
    """The mis-port of CLIPModel's own loss (return_loss=True): the images' direction alone."""
    return CLIP(**hparams, one_directional=True)

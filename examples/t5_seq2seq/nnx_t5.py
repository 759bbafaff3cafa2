"""A Flax NNX port of T5 v1.1 (`T5ForConditionalGeneration`, gated GELU) with its own module names:
`embed` (the token table; each stack is called with token ids and it), `encoder` and `decoder` (each
`rel_bias`, `layers`, `final_norm`), and the head: the token table itself (`embed.attend`), as
Hugging Face ties it, on the decoder's output scaled by d_model**-0.5. Pre-RMSNorm layers: encoder
`norm1` -> `attn` (q, k, v, o, no biases), `norm2` -> `mlp` (`gate`, `up`, `down`); decoder `norm1`
-> `self_attn`, `norm2` -> `cross_attn`, `norm3` -> `mlp`. HF's names (`shared`,
`encoder.block.N.layer.0.SelfAttention`, `layer.1.DenseReluDense.wi_0`, `EncDecAttention`,
`final_layer_norm`) are the twin's renames. Kernels are (in, out), torch's Linear weights (out, in);
the relative bias tables are (buckets, heads) on both sides. Scores are NOT divided by sqrt(d_kv):
T5 folds it into q's init.

Relative position bias: HF's table sits in the first block
(`{en,de}coder.block.0.layer.0.SelfAttention. relative_attention_bias`), which hands the bias on;
here the stack owns it (`encoder.rel_bias`, as T5X does), looks the bucketed key-minus-query offsets
up once (an nnx.Embed called with bucket ids, as HF's nn.Embedding is) and adds the bias to each
layer's self-attention: bidirectional buckets in the encoder, causal in the decoder.

Parameters are float32, `dtype` the compute dtype; scores, softmax, RMSNorm statistics and the loss
are at least float32. Masks (B, T), 1 = keep, become additive finfo(float32).min biases, as HF's
eager path. No padding_idx. Given labels and no decoder_input_ids, the decoder reads the labels
shifted right, as HF's `_shift_right`. The mis-ports are at the bottom.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

NEG = jnp.finfo(jnp.float32).min
normal = nnx.initializers.normal
f32 = lambda x: x.astype(jnp.promote_types(x.dtype, jnp.float32))  # noqa: E731  at least float32


def relative_buckets(rel, bidirectional: bool, num_buckets: int, max_distance: int):
    """HF's T5Attention._relative_position_bucket, op for op in float32 (bucket edges depend on the
    rounding)."""
    if bidirectional:
        num_buckets //= 2
        buckets, n = (rel > 0).astype(rel.dtype) * num_buckets, jnp.abs(rel)
    else:
        buckets, n = jnp.zeros_like(rel), -jnp.minimum(rel, 0)
    max_exact = num_buckets // 2
    large = max_exact + (
        jnp.log(n.astype(jnp.float32) / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).astype(rel.dtype)
    large = jnp.minimum(large, num_buckets - 1)
    return buckets + jnp.where(n < max_exact, n, large)


# T5 has no biases; HF's init: normal(d_in ** -0.5) mostly
def dense(d_in, d_out, rngs, dtype, std=None):
    return nnx.Linear(
        d_in, d_out, use_bias=False, kernel_init=normal(std or d_in**-0.5), dtype=dtype, rngs=rngs
    )


class Attention(nnx.Module):
    def __init__(self, d_model: int, d_kv: int, n_heads: int, rngs: nnx.Rngs, dtype):
        inner, self.n_heads, self.d_kv, self.scale = n_heads * d_kv, n_heads, d_kv, 1.0
        # 1/sqrt(d_kv) folded in
        self.q = dense(d_model, inner, rngs, dtype, std=(d_model * d_kv) ** -0.5)
        self.k, self.v = dense(d_model, inner, rngs, dtype), dense(d_model, inner, rngs, dtype)
        self.o = dense(inner, d_model, rngs, dtype)

    def __call__(self, x, kv, bias):  # x (B, T, D), kv (B, S, D), bias (B or 1, H, T, S) additive
        (b, t, _), s = x.shape, kv.shape[1]
        q = self.q(x).reshape(b, t, self.n_heads, self.d_kv)
        k, v = (p(kv).reshape(b, s, self.n_heads, self.d_kv) for p in (self.k, self.v))
        scores = f32(jnp.einsum("bthd,bshd->bhts", q, k)) * self.scale + bias
        probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
        return self.o(jnp.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, -1))


class MLP(nnx.Module):  # T5 v1.1's gated GELU: down(gelu_tanh(gate(x)) * up(x))
    def __init__(self, d_model: int, d_ff: int, rngs: nnx.Rngs, dtype):
        self.gate, self.up = dense(d_model, d_ff, rngs, dtype), dense(d_model, d_ff, rngs, dtype)
        self.down = dense(d_ff, d_model, rngs, dtype)

    def __call__(self, x):
        # HF's "gelu_new"
        return self.down(jax.nn.gelu(self.gate(x), approximate=True) * self.up(x))


def rms_norm(d_model, rngs, dtype):  # T5LayerNorm: no mean, no bias, statistics in float32
    return nnx.RMSNorm(d_model, epsilon=1e-6, dtype=dtype, param_dtype=jnp.float32, rngs=rngs)


class EncoderLayer(nnx.Module):
    def __init__(self, d_model, d_kv, d_ff, n_heads, rngs: nnx.Rngs, dtype):
        self.norm1, self.attn = (
            rms_norm(d_model, rngs, dtype),
            Attention(d_model, d_kv, n_heads, rngs, dtype),
        )
        self.norm2, self.mlp = rms_norm(d_model, rngs, dtype), MLP(d_model, d_ff, rngs, dtype)

    def __call__(self, x, bias):
        x = x + self.attn(h := self.norm1(x), h, bias)
        return x + self.mlp(self.norm2(x))


class DecoderLayer(nnx.Module):
    def __init__(self, d_model, d_kv, d_ff, n_heads, rngs: nnx.Rngs, dtype):
        self.norm1, self.self_attn = (
            rms_norm(d_model, rngs, dtype),
            Attention(d_model, d_kv, n_heads, rngs, dtype),
        )
        self.norm2, self.cross_attn = (
            rms_norm(d_model, rngs, dtype),
            Attention(d_model, d_kv, n_heads, rngs, dtype),
        )
        self.norm3, self.mlp = rms_norm(d_model, rngs, dtype), MLP(d_model, d_ff, rngs, dtype)

    def __call__(self, x, bias, enc, cross_bias):
        x = x + self.self_attn(h := self.norm1(x), h, bias)
        x = x + self.cross_attn(self.norm2(x), enc, cross_bias)
        return x + self.mlp(self.norm3(x))


# encoder (bidirectional buckets) or decoder (causal buckets, cross-attention)
class Stack(nnx.Module):
    def __init__(
        self,
        layer,
        n_layers,
        d_model,
        d_kv,
        d_ff,
        n_heads,
        rel_buckets,
        rel_max_distance,
        bidirectional: bool,
        rngs: nnx.Rngs,
        dtype,
    ):
        self.rel_bias = nnx.Embed(
            rel_buckets, n_heads, embedding_init=normal(d_model**-0.5), rngs=rngs
        )
        self.layers = nnx.List(
            [layer(d_model, d_kv, d_ff, n_heads, rngs, dtype) for _ in range(n_layers)]
        )
        self.final_norm = rms_norm(d_model, rngs, dtype)
        self.bidirectional, self.rel_buckets, self.rel_max_distance = (
            bidirectional,
            rel_buckets,
            rel_max_distance,
        )

    def position_bias(self, t: int):  # (1, H, t, t): key position minus query position, bucketed
        buckets = relative_buckets(
            jnp.arange(t)[None, :] - jnp.arange(t)[:, None],
            self.bidirectional,
            self.rel_buckets,
            self.rel_max_distance,
        )
        return jnp.transpose(f32(self.rel_bias(buckets)), (2, 0, 1))[None]

    # cross: encoder output, its mask bias
    def __call__(self, ids, embed: nnx.Embed, mask_bias, *cross):
        x, bias = embed(ids), self.position_bias(ids.shape[1]) + mask_bias
        for layer in self.layers:
            x = layer(x, bias, *cross)
        return self.final_norm(x)


def key_bias(mask):  # (B, S) 1 = keep -> (B, 1, 1, S) additive
    return jnp.where(mask[:, None, None, :] > 0, 0.0, NEG)


def shift_right(labels, start_id: int = 0, pad_id: int = 0):
    shifted = jnp.concatenate([jnp.full_like(labels[:, :1], start_id), labels[:, :-1]], axis=1)
    return jnp.where(shifted == -100, pad_id, shifted)


class T5(nnx.Module):
    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        d_kv: int,
        d_ff: int,
        n_layers: int,
        n_heads: int,
        rel_buckets: int,
        rel_max_distance: int,
        *,
        rngs: nnx.Rngs,
        dtype=jnp.float32,
    ):
        self.embed = nnx.Embed(
            vocab_size, d_model, embedding_init=normal(1.0), dtype=dtype, rngs=rngs
        )
        args = (n_layers, d_model, d_kv, d_ff, n_heads, rel_buckets, rel_max_distance)
        self.encoder = Stack(EncoderLayer, *args, bidirectional=True, rngs=rngs, dtype=dtype)
        self.decoder = Stack(DecoderLayer, *args, bidirectional=False, rngs=rngs, dtype=dtype)
        # the head is the token table (tied), the decoder's output scaled first
        self.scale = d_model**-0.5

    def __call__(
        self,
        input_ids,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        labels=None,
    ):
        attention_mask = jnp.ones_like(input_ids) if attention_mask is None else attention_mask
        decoder_input_ids = shift_right(labels) if decoder_input_ids is None else decoder_input_ids
        t = decoder_input_ids.shape[1]
        self_mask = jnp.tril(jnp.ones((t, t), bool))[None, None]
        if decoder_attention_mask is not None:
            self_mask = self_mask & (decoder_attention_mask[:, None, None, :] > 0)
        enc_bias = key_bias(attention_mask)
        enc = self.encoder(input_ids, self.embed, enc_bias)
        x = self.decoder(
            decoder_input_ids, self.embed, jnp.where(self_mask, 0.0, NEG), enc, enc_bias
        )
        out = {"logits": self.embed.attend(x * self.scale)}
        if labels is not None:  # HF's loss: mean cross-entropy over labels != -100, in float32
            logp = jax.nn.log_softmax(f32(out["logits"]), axis=-1)
            valid = labels != -100
            nll = -jnp.take_along_axis(logp, jnp.where(valid, labels, 0)[..., None], axis=-1)[
                ..., 0
            ]
            out["loss"] = jnp.sum(jnp.where(valid, nll, 0.0)) / jnp.sum(valid)
        return out


def t5_scaled_attention(**hparams) -> T5:
    """The mis-port: every attention divides its scores by sqrt(d_kv), as a generic transformer
    does; T5 does not."""
    model = T5(**hparams)
    for _, module in nnx.iter_graph(model):
        if isinstance(module, Attention):  # self- and cross-attention alike
            module.scale = hparams["d_kv"] ** -0.5
    return model


def t5_bidirectional_decoder_buckets(**hparams) -> T5:
    """The mis-port: the decoder's self-attention buckets its offsets bidirectionally, as the
    encoder's. Invisible while the target has at most num_buckets // 4 tokens (8 of 32 buckets): up
    to that offset the bidirectional buckets of keys at or before the query are the offsets
    themselves, as the causal ones are."""
    model = T5(**hparams)
    model.decoder.bidirectional = True
    return model

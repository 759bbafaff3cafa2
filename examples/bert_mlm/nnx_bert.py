"""A Flax NNX port of BERT for masked-LM, in the usual JAX style and with its own module names:
`embed` (token, position and token-type tables `tok`/`pos`/`type`, then `ln`), `layers` (a list of
post-LayerNorm blocks: `attn` with separate biased `q`/`k`/`v`/`o` projections, `ln1`, `mlp` with
`up`/`down`, `ln2`), and the MLM `head` (`dense` + exact GELU + `ln`, then logits against
`embed.tok`'s table with the head's own `bias`). HF's names differ
(`bert.encoder.layer.N.attention.self.query`, `intermediate.dense`, `cls.predictions.transform`,
...); the twin's renames declare them. Kernels are (in, out), torch's Linear weights (out, in).

Tied weights: the decoder has no matrix of its own; it is `embed.tok.attend` (the table transposed),
so the one `embed.tok.embedding` parameter gets both gradients, as HF's `word_embeddings.weight`
does. HF's nn.Embedding has `padding_idx=pad_token_id` (0): the lookup sends no gradient to that
row; `PAD_ID` below does the same.

Parameters are float32; `dtype` is the compute dtype. The attention softmax, LayerNorm statistics
and the loss are at least float32 (float64 in a float64 run). The attention mask (B, T), 1 = keep,
becomes HF's additive bias: finfo(float).min on padded keys.

The factories below the model are the mis-ports: `jax.nn.gelu`'s default (tanh-approximate) in the
MLP, and an attention that ignores the mask.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

INIT = nnx.initializers.normal(0.02)
# BertConfig.pad_token_id: torch's nn.Embedding(padding_idx=0) gives that row no lookup gradient
PAD_ID = 0
exact_gelu = functools.partial(jax.nn.gelu, approximate=False)  # HF's "gelu" is the erf form


class Embeddings(nnx.Module):
    def __init__(self, vocab_size, seq_len, d_model, type_vocab_size, eps, rngs: nnx.Rngs, dtype):
        self.tok, self.pos, self.type = (
            nnx.Embed(n, d_model, embedding_init=INIT, dtype=dtype, rngs=rngs)
            for n in (vocab_size, seq_len, type_vocab_size)
        )
        self.ln = nnx.LayerNorm(d_model, epsilon=eps, dtype=dtype, rngs=rngs)

    def __call__(self, input_ids, token_type_ids):
        x = self.tok(input_ids)
        x = jnp.where((input_ids == PAD_ID)[..., None], jax.lax.stop_gradient(x), x)
        x = x + self.type(token_type_ids)
        return self.ln(x + self.pos(jnp.arange(input_ids.shape[1]))[None])


class Attention(nnx.Module):
    def __init__(self, d_model: int, n_heads: int, rngs: nnx.Rngs, dtype):
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.q, self.k, self.v, self.o = (
            nnx.Linear(d_model, d_model, kernel_init=INIT, dtype=dtype, rngs=rngs) for _ in range(4)
        )

    def __call__(self, x, bias):  # x (B, T, D); bias (B, 1, 1, T) additive, or None
        b, t, _ = x.shape
        q, k, v = (
            p(x).reshape(b, t, self.n_heads, self.head_dim) for p in (self.q, self.k, self.v)
        )
        scores = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(self.head_dim)
        scores = scores.astype(jnp.promote_types(scores.dtype, jnp.float32))
        if bias is not None:
            scores = scores + bias
        probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
        return self.o(jnp.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, -1))


class MLP(nnx.Module):
    def __init__(self, d_model: int, d_ff: int, rngs: nnx.Rngs, dtype):
        self.up = nnx.Linear(d_model, d_ff, kernel_init=INIT, dtype=dtype, rngs=rngs)
        self.down = nnx.Linear(d_ff, d_model, kernel_init=INIT, dtype=dtype, rngs=rngs)
        self.act = exact_gelu

    def __call__(self, x):
        return self.down(self.act(self.up(x)))


class Layer(nnx.Module):  # post-LayerNorm, as BERT is
    def __init__(self, d_model, n_heads, d_ff, eps, rngs: nnx.Rngs, dtype):
        self.attn = Attention(d_model, n_heads, rngs, dtype)
        self.ln1 = nnx.LayerNorm(d_model, epsilon=eps, dtype=dtype, rngs=rngs)
        self.mlp = MLP(d_model, d_ff, rngs, dtype)
        self.ln2 = nnx.LayerNorm(d_model, epsilon=eps, dtype=dtype, rngs=rngs)

    def __call__(self, x, bias):
        x = self.ln1(x + self.attn(x, bias))
        return self.ln2(x + self.mlp(x))


# transform (dense, gelu, LayerNorm); the decoder is the tied table plus this bias
class Head(nnx.Module):
    def __init__(self, vocab_size: int, d_model: int, eps: float, rngs: nnx.Rngs, dtype):
        self.dense = nnx.Linear(d_model, d_model, kernel_init=INIT, dtype=dtype, rngs=rngs)
        self.ln = nnx.LayerNorm(d_model, epsilon=eps, dtype=dtype, rngs=rngs)
        self.bias = nnx.Param(jnp.zeros((vocab_size,), jnp.float32))

    def __call__(self, x, table: nnx.Embed):
        return table.attend(self.ln(exact_gelu(self.dense(x)))) + self.bias[...].astype(x.dtype)


class Bert(nnx.Module):
    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        d_ff: int,
        type_vocab_size: int,
        layer_norm_eps: float,
        *,
        rngs: nnx.Rngs,
        dtype=jnp.float32,
    ):
        self.embed = Embeddings(
            vocab_size, seq_len, d_model, type_vocab_size, layer_norm_eps, rngs, dtype
        )
        self.layers = nnx.List(
            [Layer(d_model, n_heads, d_ff, layer_norm_eps, rngs, dtype) for _ in range(n_layers)]
        )
        self.head = Head(vocab_size, d_model, layer_norm_eps, rngs, dtype)

    # (B, T) 1 = keep -> (B, 1, 1, T) additive, as HF's eager path
    def attention_bias(self, attention_mask):
        if attention_mask is None:
            return None
        # float32; float64 in a float64 run, as HF's finfo(model dtype).min
        dtype = jnp.result_type(float)
        return jnp.where(
            attention_mask[:, None, None, :] > 0, jnp.zeros((), dtype), jnp.finfo(dtype).min
        )

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        x, bias = self.embed(input_ids, token_type_ids), self.attention_bias(attention_mask)
        for layer in self.layers:
            x = layer(x, bias)
        out = {"logits": self.head(x, self.embed.tok)}
        if labels is not None:  # HF's MLM loss: mean cross-entropy over labels != -100, in float32
            logits = out["logits"]
            logp = jax.nn.log_softmax(
                logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), axis=-1
            )
            valid = labels != -100
            nll = -jnp.take_along_axis(logp, jnp.where(valid, labels, 0)[..., None], axis=-1)[
                ..., 0
            ]
            out["loss"] = jnp.sum(jnp.where(valid, nll, 0.0)) / jnp.sum(valid)
        return out


def bert_tanh_gelu(**hparams) -> Bert:
    """The mis-port: the MLP calls `jax.nn.gelu` with its default, the tanh approximation, where
    HF's is exact."""
    model = Bert(**hparams)
    for layer in model.layers:
        layer.mlp.act = jax.nn.gelu
    return model


class _MaskIgnored(Bert):
    def attention_bias(self, attention_mask):
        return None


def bert_mask_ignored(**hparams) -> Bert:
    """The mis-port: attention attends to padded keys, the attention mask dropped on the way."""
    return _MaskIgnored(**hparams)

"""A Flax NNX port of Qwen2, in the usual JAX style: one fused, biased `qkv` projection per layer
(its output columns q | k | v, grouped-query: k and v narrower than q), rotary embeddings on
rotate-half pairs, RMSNorm, SwiGLU, an untied head. Its module names are the port's own (`attn`,
`qkv`); the twin declares them. Parameters are float32; `dtype` is the compute dtype (bfloat16 under
compare's bf16 policy: the twin's `nnx_dtype_arg`), the attention softmax and RMSNorm's statistics
stay float32 as in Hugging Face's code.

The factories below the model are the mis-ports `twin.py` checks: a rotary base and an RMSNorm
epsilon copied from Llama instead of Qwen2's config.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

INIT = nnx.initializers.normal(0.02)


# x (B, T, H, hd): pairs i and i + hd/2, as Hugging Face forms them
def rotate_half_rotary(x, theta: float, positions=None):  # positions (B, T); None: 0..T-1
    t, hd = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
    at = jnp.arange(t)[None, :] if positions is None else positions
    freqs = at.astype(jnp.float32)[..., None] * inv_freq
    # as HF casts them
    cos, sin = (
        jnp.concatenate((f, f), axis=-1)[:, :, None, :].astype(x.dtype)
        for f in (jnp.cos(freqs), jnp.sin(freqs))
    )
    half = hd // 2
    return x * cos + jnp.concatenate((-x[..., half:], x[..., :half]), axis=-1) * sin


class Attention(nnx.Module):
    def __init__(
        self, d_model: int, n_heads: int, n_kv_heads: int, rope_theta: float, rngs: nnx.Rngs, dtype
    ):
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        width = (n_heads + 2 * n_kv_heads) * self.head_dim
        self.qkv = nnx.Linear(d_model, width, kernel_init=INIT, dtype=dtype, rngs=rngs)
        self.o_proj = nnx.Linear(
            n_heads * self.head_dim,
            d_model,
            use_bias=False,
            kernel_init=INIT,
            dtype=dtype,
            rngs=rngs,
        )
        self.rope_theta = rope_theta

    def __call__(self, x, positions=None, mask=None, cache=None):  # (B, T, D)
        """The training forward; decoding: the new tokens' `positions` (B, T), `mask` (B, S) of the
        real tokens over the whole sequence and this layer's `cache` ({"k", "v"} of S slots, "end":
        the slots filled), returning the cache with these tokens in it too."""
        b, t, _ = x.shape
        q_width, kv_width = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        q, k, v = jnp.split(self.qkv(x), (q_width, q_width + kv_width), axis=-1)
        q, k = (
            rotate_half_rotary(z.reshape(b, t, -1, self.head_dim), self.rope_theta, positions)
            for z in (q, k)
        )
        v = v.reshape(b, t, self.n_kv_heads, self.head_dim)
        start = 0
        if cache is not None:
            start, at = cache["end"], (0, cache["end"], 0, 0)
            k = jax.lax.dynamic_update_slice(cache["k"], k.astype(cache["k"].dtype), at)
            v = jax.lax.dynamic_update_slice(cache["v"], v.astype(cache["v"].dtype), at)
            cache = {"k": k, "v": v, "end": start + t}
        repeat = self.n_heads // self.n_kv_heads
        k, v = jnp.repeat(k, repeat, axis=2), jnp.repeat(v, repeat, axis=2)
        scores = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(self.head_dim)
        allowed = (jnp.arange(k.shape[1])[None, :] <= start + jnp.arange(t)[:, None])[None, None]
        if mask is not None:
            allowed &= mask[:, None, None, : k.shape[1]]
        probs = jax.nn.softmax(
            jnp.where(allowed, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min), axis=-1
        ).astype(x.dtype)
        out = self.o_proj(jnp.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, -1))
        return out if cache is None else (out, cache)


class MLP(nnx.Module):
    def __init__(self, d_model: int, d_ff: int, rngs: nnx.Rngs, dtype):
        self.gate_proj, self.up_proj = (
            nnx.Linear(d_model, d_ff, use_bias=False, kernel_init=INIT, dtype=dtype, rngs=rngs)
            for _ in range(2)
        )
        self.down_proj = nnx.Linear(
            d_ff, d_model, use_bias=False, kernel_init=INIT, dtype=dtype, rngs=rngs
        )

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    def __init__(
        self, d_model, n_heads, n_kv_heads, d_ff, rms_eps, rope_theta, rngs: nnx.Rngs, dtype
    ):
        self.input_layernorm = nnx.RMSNorm(d_model, epsilon=rms_eps, dtype=dtype, rngs=rngs)
        self.attn = Attention(d_model, n_heads, n_kv_heads, rope_theta, rngs, dtype)
        self.post_attention_layernorm = nnx.RMSNorm(
            d_model, epsilon=rms_eps, dtype=dtype, rngs=rngs
        )
        self.mlp = MLP(d_model, d_ff, rngs, dtype)

    def __call__(self, x):
        x = x + self.attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))

    def decode(self, x, positions, mask, cache):
        h, cache = self.attn(self.input_layernorm(x), positions, mask, cache)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), cache


class Qwen2(nnx.Module):
    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        n_kv_heads: int,
        d_ff: int,
        rms_eps: float,
        rope_theta: float,
        *,
        rngs: nnx.Rngs,
        dtype=jnp.float32,
    ):
        del seq_len  # positions come from the input's length
        self.embed_tokens = nnx.Embed(
            vocab_size, d_model, embedding_init=INIT, dtype=dtype, rngs=rngs
        )
        self.layers = nnx.List(
            [
                DecoderLayer(d_model, n_heads, n_kv_heads, d_ff, rms_eps, rope_theta, rngs, dtype)
                for _ in range(n_layers)
            ]
        )
        self.norm = nnx.RMSNorm(d_model, epsilon=rms_eps, dtype=dtype, rngs=rngs)
        self.lm_head = nnx.Linear(
            d_model, vocab_size, use_bias=False, kernel_init=INIT, dtype=dtype, rngs=rngs
        )

    def __call__(self, tokens):  # (B, T) int -> (B, T, vocab)
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def decode(model: Qwen2, tokens, positions, mask, cache=None):
    """The port's own decode path: `tokens` (B, T) at rotary `positions` (B, T), `mask` (B, S) the
    real tokens of the whole sequence; `cache` None for the prefill (a KV cache of S slots a layer
    is made, in the compute dtype), else what the last call returned. Returns (logits, cache)."""
    if cache is None:
        layer = model.layers[0].attn
        shape = (mask.shape[0], mask.shape[1], layer.n_kv_heads, layer.head_dim)
        dtype = model.embed_tokens.dtype or jnp.float32
        cache = [
            {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype), "end": 0}
            for _ in model.layers
        ]
    x, kept = model.embed_tokens(tokens), []
    for layer, layer_cache in zip(model.layers, cache):
        x, layer_cache = layer.decode(x, positions, mask, layer_cache)
        kept.append(layer_cache)
    return model.lm_head(model.norm(x)), kept


def qwen2_llama_rope_base(**hparams) -> Qwen2:
    """The mis-port: Llama's rotary base (10000) where Qwen2's config says otherwise."""
    return Qwen2(**{**hparams, "rope_theta": 10000.0})


def qwen2_llama_norm_eps(**hparams) -> Qwen2:
    """The mis-port: Llama's RMSNorm epsilon (1e-5) where Qwen2's is 1e-6."""
    return Qwen2(**{**hparams, "rms_eps": 1e-5})

"""A Flax NNX port of Gemma 2, written as a JAX team writes one (names after Google's own: an
`embedder` that embeds tokens and is the tied head, `final_norm`, `attn`), independent of
Hugging Face's code. Parameters in float32 and computation in `dtype` (bfloat16 as Hugging Face's
model loaded in bfloat16 computes: the norms, the rotary table and the softmax in float32 at least
and cast back, the embedding's scale rounded to `dtype`).

Mis-ports, each a keyword of `Gemma2` (twin.py names them):
- `norm_plus_one=False`: RMSNorm scaling by w, where Gemma's is (1 + w);
- `scale_by_head_dim=True`: attention scaled by head_dim**-0.5, not query_pre_attn_scalar**-0.5;
- `window_off_by_one=True`: the sliding window one token wider;
- `final_softcap=False`: the final logits not soft-capped.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

INIT = nnx.initializers.normal(0.02)
PAD_ID = 0


class ScaledEmbed(nnx.Embed):
    """nnx.Embed scaled by sqrt(d_model), as Hugging Face's Gemma2TextScaledWordEmbedding scales
    nn.Embedding: a subclass with a call of its own. The pad id's row takes no gradient (torch's
    padding_idx); `attend` is the tied head."""

    def __call__(self, tokens):  # (B, T) -> (B, T, D)
        x = super().__call__(tokens)
        x = jnp.where((tokens == PAD_ID)[..., None], jax.lax.stop_gradient(x), x)
        return x * jnp.sqrt(jnp.float32(self.features)).astype(x.dtype)


def at_least_float32(x):
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, plus_one: bool = True):
        self.scale = nnx.Param(jnp.zeros((dim,)))
        self.eps, self.plus_one = eps, plus_one

    def __call__(self, x):
        wide, scale = at_least_float32(x), at_least_float32(self.scale.value)
        wide = wide * jax.lax.rsqrt(jnp.mean(wide * wide, axis=-1, keepdims=True) + self.eps)
        return (wide * (1.0 + scale if self.plus_one else scale)).astype(x.dtype)


def _rotate(x, theta: float, positions=None):  # (B, T, H, hd): HF's rotate-half pairs
    t, hd = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
    at = jnp.arange(t)[None, :] if positions is None else positions  # (B or 1, T)
    freqs = at.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate((freqs, freqs), axis=-1)[:, :, None, :]
    half = jnp.concatenate((-x[..., hd // 2 :], x[..., : hd // 2]), axis=-1)
    return x * jnp.cos(angles).astype(x.dtype) + half * jnp.sin(angles).astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, hp: dict, sliding: bool, rngs: nnx.Rngs, mis: dict, dtype):
        d, h, kv, hd = hp["d_model"], hp["n_heads"], hp["n_kv_heads"], hp["head_dim"]
        linear = lambda i, o: nnx.Linear(  # noqa: E731
            i, o, use_bias=False, kernel_init=INIT, dtype=dtype, rngs=rngs
        )
        self.q_proj, self.k_proj = linear(d, h * hd), linear(d, kv * hd)
        self.v_proj, self.o_proj = linear(d, kv * hd), linear(h * hd, d)
        self.n_heads, self.n_kv_heads, self.head_dim = h, kv, hd
        self.theta, self.softcap = hp["rope_theta"], hp["attn_softcap"]
        scalar = hd if mis.get("scale_by_head_dim") else hp["query_pre_attn_scalar"]
        self.scale = scalar**-0.5
        window = hp["sliding_window"] + (1 if mis.get("window_off_by_one") else 0)
        self.window = window if sliding else None

    def __call__(self, x, positions=None, mask=None, cache=None, window=True):  # (B, T, D)
        """The training forward; decoding: `positions` (B, T) of the new tokens, `mask` (B, S) of
        the real tokens over the whole sequence, this layer's `cache` ({"k", "v"} of S slots,
        "end": the slots filled); returns the output and the cache with these tokens in it. The
        window counts slots (padding too), as Hugging Face's sliding mask does; `window=False`
        leaves it out (a mis-port's)."""
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        q, k = _rotate(q, self.theta, positions), _rotate(k, self.theta, positions)
        v = self.v_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        start = 0
        if cache is not None:
            start, at = cache["end"], (0, cache["end"], 0, 0)
            k = jax.lax.dynamic_update_slice(cache["k"], k.astype(cache["k"].dtype), at)
            v = jax.lax.dynamic_update_slice(cache["v"], v.astype(cache["v"].dtype), at)
            cache = {"k": k, "v": v, "end": start + t}
        repeat = self.n_heads // self.n_kv_heads
        k, v = jnp.repeat(k, repeat, axis=2), jnp.repeat(v, repeat, axis=2)
        scores = jnp.einsum("bthd,bshd->bhts", q, k) * self.scale
        scores = jnp.tanh(scores / self.softcap) * self.softcap
        query, key = start + jnp.arange(t)[:, None], jnp.arange(k.shape[1])[None, :]
        allowed = (key <= query)[None, None]
        if self.window is not None and window:
            allowed &= (key > query - self.window)[None, None]
        if mask is not None:
            allowed &= mask[:, None, None, : k.shape[1]]
        scores = at_least_float32(jnp.where(allowed, scores, jnp.finfo(scores.dtype).min))
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = self.o_proj(jnp.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, -1))
        return out if cache is None else (out, cache)


class MLP(nnx.Module):
    def __init__(self, d_model: int, d_ff: int, rngs: nnx.Rngs, dtype):
        linear = lambda i, o: nnx.Linear(  # noqa: E731
            i, o, use_bias=False, kernel_init=INIT, dtype=dtype, rngs=rngs
        )
        self.gate_proj, self.up_proj = linear(d_model, d_ff), linear(d_model, d_ff)
        self.down_proj = linear(d_ff, d_model)

    def __call__(self, x):
        return self.down_proj(jax.nn.gelu(self.gate_proj(x), approximate=True) * self.up_proj(x))


class Block(nnx.Module):
    def __init__(self, hp: dict, sliding: bool, rngs: nnx.Rngs, mis: dict, dtype):
        norm = lambda: RMSNorm(hp["d_model"], hp["rms_eps"], not mis.get("norm_times_w"))  # noqa: E731
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()
        self.attn = Attention(hp, sliding, rngs, mis, dtype)
        self.mlp = MLP(hp["d_model"], hp["d_ff"], rngs, dtype)

    def __call__(self, x):
        x = x + self.post_attention_layernorm(self.attn(self.input_layernorm(x)))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))

    def decode(self, x, positions, mask, cache, window=True):
        h, cache = self.attn(self.input_layernorm(x), positions, mask, cache, window)
        x = x + self.post_attention_layernorm(h)
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return x, cache


class Gemma2(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs, mis: dict | None = None, dtype=jnp.float32, **hp):
        mis = mis or {}
        self.embedder = ScaledEmbed(
            hp["vocab_size"], hp["d_model"], embedding_init=INIT, dtype=dtype, rngs=rngs
        )
        # Gemma 2 alternates: a sliding window on layers 0, 2, ..., full attention on 1, 3, ...
        self.layers = nnx.List(
            [Block(hp, i % 2 == 0, rngs, mis, dtype) for i in range(hp["n_layers"])]
        )
        self.final_norm = RMSNorm(hp["d_model"], hp["rms_eps"], not mis.get("norm_times_w"))
        self.final_softcap = None if mis.get("no_final_softcap") else hp["final_softcap"]

    def __call__(self, tokens):  # (B, T) int -> (B, T, vocab)
        x = self.embedder(tokens)
        for layer in self.layers:
            x = layer(x)
        logits = self.embedder.attend(self.final_norm(x))
        if self.final_softcap is None:
            return logits
        return jnp.tanh(logits / self.final_softcap) * self.final_softcap


def decode(model: Gemma2, tokens, positions, mask, cache=None, window_over_cache=True):
    """The port's own decode path: `tokens` (B, T) at rotary `positions` (B, T), `mask` (B, S) the
    real tokens of the whole sequence; `cache` None for the prefill (a KV cache of S slots a layer
    is made, in the compute dtype), else what the last call returned. Returns (logits, cache)."""
    if cache is None:
        layer = model.layers[0].attn
        shape = (mask.shape[0], mask.shape[1], layer.n_kv_heads, layer.head_dim)
        dtype = model.embedder.dtype or jnp.float32
        cache = [
            {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype), "end": 0}
            for _ in model.layers
        ]
        window_over_cache = True  # the prefill is right: only the new tokens' window is off
    x, kept = model.embedder(tokens), []
    for layer, layer_cache in zip(model.layers, cache):
        x, layer_cache = layer.decode(x, positions, mask, layer_cache, window_over_cache)
        kept.append(layer_cache)
    logits = model.embedder.attend(model.final_norm(x))
    if model.final_softcap is not None:
        logits = jnp.tanh(logits / model.final_softcap) * model.final_softcap
    return logits, kept


def decode_window_not_over_cache(model: Gemma2, tokens, positions, mask, cache=None):
    """A decode-only mis-port: each new token attends to the whole cache on the sliding layers, the
    window left out (the prefill applies it)."""
    return decode(model, tokens, positions, mask, cache, window_over_cache=False)


def gemma2_norm_times_w(**hp) -> Gemma2:
    return Gemma2(**hp, mis={"norm_times_w": True})


def gemma2_scaled_by_head_dim(**hp) -> Gemma2:
    return Gemma2(**hp, mis={"scale_by_head_dim": True})


def gemma2_window_off_by_one(**hp) -> Gemma2:
    return Gemma2(**hp, mis={"window_off_by_one": True})


def gemma2_no_final_softcap(**hp) -> Gemma2:
    return Gemma2(**hp, mis={"no_final_softcap": True})

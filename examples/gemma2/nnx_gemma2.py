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


def _rotate(x, theta: float):  # (B, T, H, hd): Hugging Face's rotate-half pairs
    t, hd = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
    freqs = jnp.arange(t, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    angles = jnp.concatenate((freqs, freqs), axis=-1)[None, :, None, :]
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

    def __call__(self, x):  # (B, T, D)
        b, t, _ = x.shape
        q = _rotate(self.q_proj(x).reshape(b, t, self.n_heads, self.head_dim), self.theta)
        k = _rotate(self.k_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim), self.theta)
        v = self.v_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        repeat = self.n_heads // self.n_kv_heads
        k, v = jnp.repeat(k, repeat, axis=2), jnp.repeat(v, repeat, axis=2)
        scores = jnp.einsum("bthd,bshd->bhts", q, k) * self.scale
        scores = jnp.tanh(scores / self.softcap) * self.softcap
        query, key = jnp.arange(t)[:, None], jnp.arange(t)[None, :]
        allowed = key <= query
        if self.window is not None:
            allowed &= key > query - self.window
        scores = at_least_float32(jnp.where(allowed, scores, jnp.finfo(scores.dtype).min))
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        return self.o_proj(jnp.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, -1))


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


def gemma2_norm_times_w(**hp) -> Gemma2:
    return Gemma2(**hp, mis={"norm_times_w": True})


def gemma2_scaled_by_head_dim(**hp) -> Gemma2:
    return Gemma2(**hp, mis={"scale_by_head_dim": True})


def gemma2_window_off_by_one(**hp) -> Gemma2:
    return Gemma2(**hp, mis={"window_off_by_one": True})


def gemma2_no_final_softcap(**hp) -> Gemma2:
    return Gemma2(**hp, mis={"no_final_softcap": True})

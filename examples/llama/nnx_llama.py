"""The Flax NNX port of `torch_llama.py`, written as a team porting its model would write it. Module
names follow the port's own style (`attn`, not `self_attn`); the twin declares that one rename. NNX
keeps Linear kernels (in, out), Embed's `embedding` and RMSNorm's `scale`: the toolkit derives every
layout from the two trees.

`rope_layout` picks how rotary pairs are formed: "rotate_half" (Hugging Face's, pairs i and i +
hd/2, what the torch model does) or "interleaved" (Meta's original checkpoints, pairs 2i and 2i +
1). The second one is the classic port mistake `twin.py:llama_tiny_misported` makes.

`kernel` picks the attention and the norms: jnp ops as the torch model computes them ("reference"),
or the Pallas kernels of kernels.py, forward and backward: flash attention and a fused RMSNorm
("pallas"), or one of them ("pallas-attention", "pallas-norm": the fused RMSNorm runs in float64,
flash attention does not); `twin.py:llama_kernels` names it the twin's kernel switch, so the same
twin runs both ways (`--jax-set model.kernel=pallas`).

`rope_table` holds the rotary frequencies in a `Buffer` per attention, as `torch_llama.py` holds
them in its `inv_freq` buffer, built with that base (None: computed in the forward from
`rope_theta`). `twin.py:llama_table` holds them; `llama_table_misported` builds them with Llama 3's
base, the compare names that buffer.

Parameters are float32; `dtype` is the compute dtype (bfloat16 under compare's bf16 policy: the
twin's `nnx_dtype_arg`); the attention softmax and the rotary tables stay float32, as in
`torch_llama.py` (a bf16 query times float32 tables computes in float32 on both sides).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import kernels
from flax import nnx


def _linear(n_in: int, n_out: int, rngs: nnx.Rngs, dtype) -> nnx.Linear:
    return nnx.Linear(
        n_in,
        n_out,
        use_bias=False,
        kernel_init=nnx.initializers.normal(0.02),
        dtype=dtype,
        rngs=rngs,
    )


class Buffer(nnx.Variable):
    """A value the model holds and never trains, as torch's `register_buffer` (not an nnx.Param: no
    optimizer updates it)."""


def frequencies(theta: float, hd: int):
    return 1.0 / theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)


def rotary(x, inv_freq, layout: str, positions=None):  # x (B, T, H, hd); positions (B, T)
    t, hd = x.shape[1], x.shape[-1]
    at = jnp.arange(t)[None, :] if positions is None else positions
    freqs = at.astype(jnp.float32)[..., None] * inv_freq  # (B or 1, T, hd/2)
    if layout == "rotate_half":
        cos, sin = (
            jnp.concatenate((f, f), axis=-1)[:, :, None, :]
            for f in (jnp.cos(freqs), jnp.sin(freqs))
        )
        half = hd // 2
        return x * cos + jnp.concatenate((-x[..., half:], x[..., :half]), axis=-1) * sin
    cos, sin = jnp.cos(freqs)[:, :, None, :], jnp.sin(freqs)[:, :, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return jnp.stack((even * cos - odd * sin, even * sin + odd * cos), axis=-1).reshape(x.shape)


class FusedRMSNorm(nnx.Module):
    """RMSNorm by a Pallas kernel (kernels.py), its weight named as nnx.RMSNorm's (`scale`)."""

    def __init__(self, dim: int, epsilon: float, kernel: str, dtype, rngs: nnx.Rngs):
        del rngs
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.epsilon, self.kernel, self.dtype = epsilon, kernel, dtype

    def __call__(self, x):
        x = x.astype(self.dtype or x.dtype)
        return kernels.NORM[self.kernel](x, self.scale.value.astype(x.dtype), self.epsilon)


def rms_norm(dim, eps, kernel: str, dtype, rngs):
    """The norm `kernel` asks for: flax's RMSNorm, or the fused kernel."""
    if kernel in kernels.NORM:
        return FusedRMSNorm(dim, eps, kernel, dtype, rngs)
    return nnx.RMSNorm(dim, epsilon=eps, dtype=dtype, rngs=rngs)


class Attention(nnx.Module):
    def __init__(
        self,
        d_model,
        n_heads,
        n_kv_heads,
        rope_theta,
        rope_layout,
        rngs: nnx.Rngs,
        dtype,
        rope_table=None,
        kernel: str = "reference",
    ):
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = _linear(d_model, n_heads * self.head_dim, rngs, dtype)
        self.k_proj = _linear(d_model, n_kv_heads * self.head_dim, rngs, dtype)
        self.v_proj = _linear(d_model, n_kv_heads * self.head_dim, rngs, dtype)
        self.o_proj = _linear(n_heads * self.head_dim, d_model, rngs, dtype)
        self.rope_theta, self.rope_layout, self.kernel = rope_theta, rope_layout, kernel
        if rope_table is not None:
            self.inv_freq = Buffer(frequencies(rope_table, self.head_dim))

    def __call__(self, x, positions=None, mask=None, cache=None):  # (B, T, D)
        """The training forward; for decoding, `positions` (B, T) of the new tokens, `mask` (B, S)
        of the real tokens over the whole sequence and this layer's `cache` ({"k", "v"} of S slots,
        "end": the slots filled): returns the output and the cache with these tokens in it."""
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        inv_freq = (
            self.inv_freq.value
            if hasattr(self, "inv_freq")
            else frequencies(self.rope_theta, self.head_dim)
        )
        q, k = (rotary(z, inv_freq, self.rope_layout, positions) for z in (q, k))
        start = 0
        if cache is not None:
            start = cache["end"]
            k = jax.lax.dynamic_update_slice(
                cache["k"], k.astype(cache["k"].dtype), (0, start, 0, 0)
            )
            v = jax.lax.dynamic_update_slice(
                cache["v"], v.astype(cache["v"].dtype), (0, start, 0, 0)
            )
            cache = {"k": k, "v": v, "end": start + t}
        repeat = self.n_heads // self.n_kv_heads
        keys, values = jnp.repeat(k, repeat, axis=2), jnp.repeat(v, repeat, axis=2)
        if cache is None and mask is None and self.kernel in kernels.ATTENTION:
            attend = kernels.ATTENTION[self.kernel]
            out = attend(q, keys, values, 1.0 / math.sqrt(self.head_dim)).astype(x.dtype)
            return self.o_proj(out.reshape(b, t, -1))
        scores = jnp.einsum("bthd,bshd->bhts", q, keys) / math.sqrt(self.head_dim)
        # causal over the slots; a padding slot is never attended to
        allowed = (jnp.arange(keys.shape[1])[None, :] <= start + jnp.arange(t)[:, None])[None, None]
        if mask is not None:
            allowed = allowed & mask[:, None, None, : keys.shape[1]]
        scores = jnp.where(allowed, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
        out = self.o_proj(jnp.einsum("bhts,bshd->bthd", probs, values).reshape(b, t, -1))
        return out if cache is None else (out, cache)


class MLP(nnx.Module):
    def __init__(self, d_model, d_ff, rngs: nnx.Rngs, dtype):
        self.gate_proj = _linear(d_model, d_ff, rngs, dtype)
        self.up_proj = _linear(d_model, d_ff, rngs, dtype)
        self.down_proj = _linear(d_ff, d_model, rngs, dtype)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    def __init__(
        self,
        d_model,
        n_heads,
        n_kv_heads,
        d_ff,
        rms_eps,
        rope_theta,
        rope_layout,
        rngs: nnx.Rngs,
        dtype,
        rope_table=None,
        kernel_choice: tuple[str, str] = ("reference", "reference"),
    ):
        attention_kernel, norm_kernel = kernel_choice
        self.input_layernorm = rms_norm(d_model, rms_eps, norm_kernel, dtype, rngs)
        self.attn = Attention(
            d_model,
            n_heads,
            n_kv_heads,
            rope_theta,
            rope_layout,
            rngs,
            dtype,
            rope_table,
            attention_kernel,
        )
        self.post_attention_layernorm = rms_norm(d_model, rms_eps, norm_kernel, dtype, rngs)
        self.mlp = MLP(d_model, d_ff, rngs, dtype)

    def __call__(self, x):
        x = x + self.attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))

    def decode(self, x, positions, mask, cache):
        h, cache = self.attn(self.input_layernorm(x), positions, mask, cache)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), cache


# what each value of `kernel` runs by a Pallas kernel: flash attention, the fused RMSNorm, or both
KERNELS = {
    "reference": (),
    "pallas": ("attention", "norm"),
    "pallas-attention": ("attention",),
    "pallas-norm": ("norm",),
}


class Llama(nnx.Module):
    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        n_kv_heads: int,
        d_ff: int,
        rms_eps: float = 1e-5,
        rope_theta: float = 10000.0,
        rope_layout: str = "rotate_half",
        rope_table: float | None = None,
        kernel: str = "reference",
        *,
        rngs: nnx.Rngs,
        dtype=jnp.float32,
        kernel_ports: dict | None = None,
    ):
        # KERNELS[kernel]: the pieces run by kernels.py's Pallas kernels; `kernel_ports` replaces
        # a chosen one by another of kernels.py's ports ({"attention": ..., "norm": ...})
        ports = {piece: "pallas" for piece in KERNELS[kernel]}
        ports.update({k: v for k, v in (kernel_ports or {}).items() if k in ports})
        chosen = (ports.get("attention", "reference"), ports.get("norm", "reference"))
        self.embed_tokens = nnx.Embed(
            vocab_size,
            d_model,
            embedding_init=nnx.initializers.normal(0.02),
            dtype=dtype,
            rngs=rngs,
        )
        self.layers = nnx.List(
            [
                DecoderLayer(
                    d_model,
                    n_heads,
                    n_kv_heads,
                    d_ff,
                    rms_eps,
                    rope_theta,
                    rope_layout,
                    rngs,
                    dtype,
                    rope_table,
                    chosen,
                )
                for _ in range(n_layers)
            ]
        )
        self.norm = rms_norm(d_model, rms_eps, chosen[1], dtype, rngs)
        self.lm_head = _linear(d_model, vocab_size, rngs, dtype)

    def __call__(self, tokens):  # (B, T) int -> (B, T, vocab)
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def init_cache(model: Llama, batch: int, length: int, dtype) -> list[dict]:
    """An empty KV cache of `length` slots a layer."""
    layer = model.layers[0].attn
    shape = (batch, length, layer.n_kv_heads, layer.head_dim)
    empty = {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype), "end": 0}
    return [dict(empty) for _ in model.layers]


def decode(model: Llama, tokens, positions, mask, cache=None):
    """The port's own decode path: `tokens` (B, T) at rotary `positions` (B, T), `mask` (B, S) the
    real (not padding) tokens of the whole sequence of S; `cache` None for the prefill (a KV cache
    of S slots a layer, in the compute dtype, is made), else what the last call returned. Returns
    (logits (B, T, vocab), cache)."""
    if cache is None:
        cache = init_cache(model, *mask.shape, model.embed_tokens.dtype or jnp.float32)
    x, kept = model.embed_tokens(tokens), []
    for layer, layer_cache in zip(model.layers, cache):
        x, layer_cache = layer.decode(x, positions, mask, layer_cache)
        kept.append(layer_cache)
    return model.lm_head(model.norm(x)), kept


def decode_position_off(model: Llama, tokens, positions, mask, cache=None):
    """A decode-only mis-port: each new token's rotary position one past its place (the prefill
    right), as a port that takes the position from the cache's length after writing to it."""
    return decode(model, tokens, positions if cache is None else positions + 1, mask, cache)


def decode_padding_seen(model: Llama, tokens, positions, mask, cache=None):
    """A decode-only mis-port: the prefill masks the left padding, each new token attends to it."""
    return decode(model, tokens, positions, mask if cache is None else jnp.ones_like(mask), cache)


def decode_cache_bfloat16(model: Llama, tokens, positions, mask, cache=None):
    """A decode-only mis-port: the KV cache kept in bfloat16 whatever the model computes in."""
    if cache is None:
        cache = init_cache(model, *mask.shape, jnp.bfloat16)
    return decode(model, tokens, positions, mask, cache)


def llama_interleaved(**hparams) -> Llama:
    """The mis-port: rotary pairs formed as Meta's original code does, while the torch model rotates
    halves."""
    return Llama(**hparams, rope_layout="interleaved")


def llama_table(**hparams) -> Llama:
    """The rotary frequencies held in a Buffer per attention, built with the model's base, as
    torch_llama.py holds them."""
    return Llama(**hparams, rope_table=hparams.get("rope_theta", 10000.0))


def llama_table_misported(**hparams) -> Llama:
    """The mis-port: the held frequencies built with Llama 3's base (500000), not the model's."""
    return Llama(**hparams, rope_table=500000.0)


def llama_rope_base_off(**hparams) -> Llama:
    """The mis-port only float64 sees: the rotary base one more than the model's (10001 for
    10000), 6e-5 in the logits, below float32's bounds."""
    return Llama(**{**hparams, "rope_theta": hparams.get("rope_theta", 10000.0) + 1.0})


def llama_flash_unscaled(**hparams) -> Llama:
    """The kernel mis-port: flash attention called without its softmax scale (jax's kernel defaults
    to 1.0, SDPA to 1/sqrt(head_dim)); the reference path is right."""
    return Llama(**hparams, kernel_ports={"attention": "pallas-unscaled"})


def llama_flash_block_ahead(**hparams) -> Llama:
    """The kernel mis-port: an own flash kernel whose causal mask is one key block ahead."""
    return Llama(**hparams, kernel_ports={"attention": "pallas-block-ahead"})


def llama_rms_eps_outside(**hparams) -> Llama:
    """The kernel mis-port only float64 sees: the fused RMSNorm adds epsilon to the root, not under
    it (about epsilon/2 relative)."""
    return Llama(**hparams, kernel_ports={"norm": "pallas-eps-outside"})

"""A Flax NNX port of Mixtral, in the usual JAX style: each layer's sparse MoE block (`moe`) has a
`router` (an `nnx.Linear` to one logit per expert) and `experts` holding every expert's weights
stacked, input-major (`gate_up` (E, D, 2I), `down` (E, I, D)); every expert runs on every token and
the top-k weights pick the sum (dense dispatch: one einsum, no gather; what a port for an
accelerator often does at small scale). Routing as Mixtral's: `jax.lax.top_k` over the router's
softmax (in float32, as Hugging Face's), the k weights renormalised to sum to 1. Attention with
separate q/k/v projections, grouped-query, rotate-half rotary pairs; RMSNorm; an untied head.
Parameters are float32; `dtype` is the compute dtype (bfloat16 under compare's bf16 policy: the
twin's `nnx_dtype_arg`), the attention softmax and the router's in float32.

`kernel="ragged_dot"` runs the experts as one grouped matmul a projection (`GroupedExperts`:
`jax.lax.ragged_dot` over the tokens sorted by expert), the op a TPU's grouped-matmul kernels
implement, where the dense dispatch is the reference (twin.py's `mixtral_kernels` names `kernel` its
kernel switch).

The factories below the model are the mis-ports `twin.py` checks: the router's softmax over the
tokens instead of the experts (a routing mis-port that changes the choices), the top-k weights not
renormalised (one that changes the weights, not the choices) and GELU for the experts' SiLU.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

INIT = nnx.initializers.normal(0.02)


# x (B, T, H, hd): pairs i and i + hd/2, as Hugging Face forms them
def rotate_half_rotary(x, theta: float):
    t, hd = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
    freqs = jnp.arange(t, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    # as HF casts them
    cos, sin = (
        jnp.concatenate((f, f), axis=-1)[None, :, None, :].astype(x.dtype)
        for f in (jnp.cos(freqs), jnp.sin(freqs))
    )
    half = hd // 2
    return x * cos + jnp.concatenate((-x[..., half:], x[..., :half]), axis=-1) * sin


class Attention(nnx.Module):
    def __init__(
        self, d_model: int, n_heads: int, n_kv_heads: int, rope_theta: float, rngs: nnx.Rngs, dtype
    ):
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        linear = lambda i, o: nnx.Linear(
            i, o, use_bias=False, kernel_init=INIT, dtype=dtype, rngs=rngs
        )  # noqa: E731
        self.q_proj, self.o_proj = linear(d_model, d_model), linear(d_model, d_model)
        self.k_proj, self.v_proj = (linear(d_model, n_kv_heads * self.head_dim) for _ in range(2))
        self.rope_theta = rope_theta

    def __call__(self, x):  # (B, T, D)
        b, t, _ = x.shape
        q = rotate_half_rotary(
            self.q_proj(x).reshape(b, t, self.n_heads, self.head_dim), self.rope_theta
        )
        k = rotate_half_rotary(
            self.k_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim), self.rope_theta
        )
        v = self.v_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        repeat = self.n_heads // self.n_kv_heads
        k, v = jnp.repeat(k, repeat, axis=2), jnp.repeat(v, repeat, axis=2)
        scores = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(self.head_dim)
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))
        probs = jax.nn.softmax(
            jnp.where(causal, scores.astype(jnp.float32), -jnp.inf), axis=-1
        ).astype(x.dtype)
        return self.o_proj(jnp.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, -1))


class Experts(nnx.Module):
    def __init__(
        self, n_experts: int, d_model: int, d_ff: int, rngs: nnx.Rngs, activation=jax.nn.silu
    ):
        self.gate_up = nnx.Param(INIT(rngs.params(), (n_experts, d_model, 2 * d_ff)))
        self.down = nnx.Param(INIT(rngs.params(), (n_experts, d_ff, d_model)))
        self.activation = activation

    # x (N, D), weights (N, E): each token's routing weight of each expert
    def __call__(self, x, weights):
        gate, up = jnp.split(
            jnp.einsum("nd,edf->enf", x, self.gate_up[...].astype(x.dtype)), 2, axis=-1
        )
        y = jnp.einsum("enf,efd->end", self.activation(gate) * up, self.down[...].astype(x.dtype))
        return jnp.einsum("ne,end->nd", weights, y)


class TopKExperts(Experts):
    """The same experts called as Hugging Face calls its own: each token's k expert indices and k
    weights, not a dense (tokens, experts) matrix."""

    # x (N, D), top_k_index (N, k) int, top_k_weights (N, k)
    def __call__(self, x, top_k_index, top_k_weights):
        gate, up = jnp.split(
            jnp.einsum("nd,edf->enf", x, self.gate_up[...].astype(x.dtype)), 2, axis=-1
        )
        y = jnp.einsum("enf,efd->end", self.activation(gate) * up, self.down[...].astype(x.dtype))
        chosen = y[top_k_index, jnp.arange(x.shape[0])[:, None]]  # (N, k, D)
        return jnp.einsum("nk,nkd->nd", top_k_weights, chosen)


class GroupedExperts(TopKExperts):
    """The same experts as one grouped matmul a projection (`jax.lax.ragged_dot`, the op a TPU's
    grouped-matmul kernels implement): each token's k (token, expert) pairs sorted by expert, each
    expert's rows multiplied by its weights alone, the results put back in the tokens' order."""

    def __call__(self, x, top_k_index, top_k_weights):
        n, k = top_k_index.shape
        experts = top_k_index.reshape(-1)
        order = jnp.argsort(experts, stable=True)
        rows = x[order // k]  # each pair's token, grouped by expert
        sizes = jnp.bincount(experts, length=self.gate_up.shape[0]).astype(jnp.int32)
        gate_up = jax.lax.ragged_dot(rows, self.gate_up[...].astype(x.dtype), sizes)
        gate, up = jnp.split(gate_up, 2, axis=-1)
        y = jax.lax.ragged_dot(self.activation(gate) * up, self.down[...].astype(x.dtype), sizes)
        chosen = jnp.zeros_like(y).at[order].set(y).reshape(n, k, -1)  # back in the pairs' order
        return jnp.einsum("nk,nkd->nd", top_k_weights, chosen)


class MoE(nnx.Module):
    def __init__(
        self,
        d_model: int,
        d_ff: int,
        n_experts: int,
        top_k: int,
        rngs: nnx.Rngs,
        dtype,
        renormalise=True,
        activation=jax.nn.silu,
        softmax_axis=-1,
        top_k_experts=False,
        kernel="reference",
    ):
        self.router = nnx.Linear(
            d_model, n_experts, use_bias=False, kernel_init=INIT, dtype=dtype, rngs=rngs
        )
        experts = TopKExperts if top_k_experts else Experts
        experts = GroupedExperts if kernel == "ragged_dot" else experts
        self.experts = experts(n_experts, d_model, d_ff, rngs, activation)
        self.n_experts, self.top_k, self.renormalise, self.softmax_axis = (
            n_experts,
            top_k,
            renormalise,
            softmax_axis,
        )

    def __call__(self, x):  # (B, T, D)
        b, t, d = x.shape
        x = x.reshape(b * t, d)
        probs = jax.nn.softmax(self.router(x).astype(jnp.float32), axis=self.softmax_axis)
        top_w, top_i = jax.lax.top_k(probs, self.top_k)
        if self.renormalise:
            top_w = top_w / top_w.sum(axis=-1, keepdims=True)
        if isinstance(self.experts, TopKExperts):
            return self.experts(x, top_i, top_w.astype(x.dtype)).reshape(b, t, d)
        # (N, E)
        weights = jnp.sum(jax.nn.one_hot(top_i, self.n_experts) * top_w[..., None], axis=1)
        return self.experts(x, weights.astype(x.dtype)).reshape(b, t, d)


class DecoderLayer(nnx.Module):
    def __init__(
        self,
        d_model,
        n_heads,
        n_kv_heads,
        d_ff,
        n_experts,
        top_k,
        rms_eps,
        rope_theta,
        rngs: nnx.Rngs,
        dtype,
        **moe,
    ):
        self.input_layernorm = nnx.RMSNorm(d_model, epsilon=rms_eps, dtype=dtype, rngs=rngs)
        self.attn = Attention(d_model, n_heads, n_kv_heads, rope_theta, rngs, dtype)
        self.post_attention_layernorm = nnx.RMSNorm(
            d_model, epsilon=rms_eps, dtype=dtype, rngs=rngs
        )
        self.moe = MoE(d_model, d_ff, n_experts, top_k, rngs, dtype, **moe)

    def __call__(self, x):
        x = x + self.attn(self.input_layernorm(x))
        return x + self.moe(self.post_attention_layernorm(x))


class Mixtral(nnx.Module):
    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        n_kv_heads: int,
        d_ff: int,
        n_experts: int,
        top_k: int,
        rms_eps: float,
        rope_theta: float,
        kernel: str = "reference",
        *,
        rngs: nnx.Rngs,
        dtype=jnp.float32,
        **moe,
    ):
        del seq_len  # positions come from the input's length
        if kernel not in ("reference", "ragged_dot"):
            raise ValueError(f"kernel {kernel!r}: this port has 'reference' and 'ragged_dot'")
        moe = {**moe, "kernel": kernel}
        self.embed_tokens = nnx.Embed(
            vocab_size, d_model, embedding_init=INIT, dtype=dtype, rngs=rngs
        )
        self.layers = nnx.List(
            [
                DecoderLayer(
                    d_model,
                    n_heads,
                    n_kv_heads,
                    d_ff,
                    n_experts,
                    top_k,
                    rms_eps,
                    rope_theta,
                    rngs,
                    dtype,
                    **moe,
                )
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


def mixtral_softmax_over_tokens(**hparams) -> Mixtral:
    """The routing mis-port: the router's softmax taken over the tokens (axis 0) instead of the
    experts."""
    return Mixtral(**hparams, softmax_axis=0)


def mixtral_not_renormalised(**hparams) -> Mixtral:
    """The routing mis-port: the top-k weights used as the softmax gave them, not renormalised to
    sum to 1."""
    return Mixtral(**hparams, renormalise=False)


def mixtral_top_k_experts(**hparams) -> Mixtral:
    """The port whose experts take Hugging Face's arguments: hidden, top_k_index, top_k_weights."""
    return Mixtral(**hparams, top_k_experts=True)


def mixtral_top_k_not_renormalised(**hparams) -> Mixtral:
    """The routing mis-port in that port: the top-k weights passed to the experts as the softmax
    gave them, not renormalised."""
    return Mixtral(**hparams, top_k_experts=True, renormalise=False)


def mixtral_gelu_experts(**hparams) -> Mixtral:
    """The experts' mis-port: GELU where Mixtral's experts use SiLU."""
    return Mixtral(**hparams, activation=jax.nn.gelu)

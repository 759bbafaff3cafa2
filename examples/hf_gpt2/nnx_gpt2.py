"""A Flax NNX port of GPT-2, written as a team porting it would write it: nn.Linear-style kernels
(in, out) where Hugging Face keeps `Conv1D` weights (in, out) too, one fused q|k|v projection as
HF's `c_attn`, the head tied to the token embedding (`wte.attend`). Names follow HF's behind its
`transformer.` (the twin's one rename).

`qkv_order` is the order the fused projection's output is split in: "qkv" (HF's), or "kvq", the
mis-port `twin.py:gpt2_qkv_misported` makes. `tied=False` gives the port a head of its own, which
HF's checkpoint cannot fill (its head is its embedding): the twin is refused, naming the tie.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

INIT = nnx.initializers.normal(0.02)


def _dense(n_in: int, n_out: int, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(n_in, n_out, kernel_init=INIT, rngs=rngs)


class Attention(nnx.Module):
    def __init__(self, d_model: int, n_heads: int, qkv_order: str, rngs: nnx.Rngs):
        self.n_heads, self.qkv_order = n_heads, qkv_order
        if qkv_order == "split":  # three projections of their own, as most ports write them
            self.q, self.k, self.v = (_dense(d_model, d_model, rngs) for _ in "qkv")
        else:
            self.c_attn = _dense(d_model, 3 * d_model, rngs)
        self.c_proj = _dense(d_model, d_model, rngs)

    def __call__(self, x):  # (B, T, D)
        b, t, d = x.shape
        parts = (
            {"q": self.q(x), "k": self.k(x), "v": self.v(x)}
            if self.qkv_order == "split"
            else dict(zip(self.qkv_order, jnp.split(self.c_attn(x), 3, axis=-1)))
        )
        q, k, v = (parts[n].reshape(b, t, self.n_heads, d // self.n_heads) for n in "qkv")
        scores = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(d // self.n_heads)
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))
        probs = jax.nn.softmax(jnp.where(causal, scores, jnp.finfo(scores.dtype).min), axis=-1)
        return self.c_proj(jnp.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, d))


class MLP(nnx.Module):
    def __init__(self, d_model: int, rngs: nnx.Rngs):
        self.c_fc = _dense(d_model, 4 * d_model, rngs)
        self.c_proj = _dense(4 * d_model, d_model, rngs)

    def __call__(self, x):
        return self.c_proj(jax.nn.gelu(self.c_fc(x), approximate=True))  # HF's gelu_new


class Block(nnx.Module):
    def __init__(self, d_model: int, n_heads: int, ln_eps: float, qkv_order: str, rngs):
        self.ln_1 = nnx.LayerNorm(d_model, epsilon=ln_eps, rngs=rngs)
        self.attn = Attention(d_model, n_heads, qkv_order, rngs)
        self.ln_2 = nnx.LayerNorm(d_model, epsilon=ln_eps, rngs=rngs)
        self.mlp = MLP(d_model, rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nnx.Module):
    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        ln_eps: float,
        qkv_order: str = "qkv",
        tied: bool = True,
        *,
        rngs: nnx.Rngs,
    ):
        self.wte = nnx.Embed(vocab_size, d_model, embedding_init=INIT, rngs=rngs)
        self.wpe = nnx.Embed(seq_len, d_model, embedding_init=INIT, rngs=rngs)
        self.h = nnx.List(
            [Block(d_model, n_heads, ln_eps, qkv_order, rngs) for _ in range(n_layers)]
        )
        self.ln_f = nnx.LayerNorm(d_model, epsilon=ln_eps, rngs=rngs)
        self.lm_head = None if tied else nnx.Linear(d_model, vocab_size, use_bias=False, rngs=rngs)

    def __call__(self, tokens):  # (B, T) int -> (B, T, vocab)
        x = self.wte(tokens) + self.wpe(jnp.arange(tokens.shape[1]))[None]
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        return self.wte.attend(x) if self.lm_head is None else self.lm_head(x)


def gpt2_qkv_misported(**hparams) -> GPT2:
    """The mis-port: the fused projection's output split as k|v|q, where HF's is q|k|v."""
    return GPT2(**hparams, qkv_order="kvq")


def gpt2_split_qkv(**hparams) -> GPT2:
    """The port with separate q, k and v projections, where HF's Conv1D `c_attn` packs them along
    its output columns."""
    return GPT2(**hparams, qkv_order="split")


def gpt2_untied(**hparams) -> GPT2:
    """A head of its own: HF's GPT-2 ties its head to `wte`: its checkpoint has no head to give."""
    return GPT2(**hparams, tied=False)

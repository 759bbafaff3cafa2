"""The Flax NNX port of `torch_tp.py`, tensor-parallel by `jax.shard_map`: each attention and MLP is
a manual region over the mesh's "tensor" axis (and "data" for the batch), given each device's
shard of its weights by the region's in_specs (column-parallel q/k/v and fc1, row-parallel o and
fc2, as the twin's partition rules place them), returning the psum of its partial sums over
"tensor". The layers hold their weights in `nnx.Linear`s (their names and layouts the
checkpoints'), read inside the region by their kernels.

The factory takes the run's mesh (`mesh`, the twin's `nnx_mesh_arg`). `region_bug` makes the
mis-ports of `twin.py`: the MLP's psum left out ("missing_psum"), taken over the "data" axis
instead of "tensor" ("psum_data"), or its fc1 column shards passed between ranks by a permutation
with the last two ranks crossed ("wrong_rank"); each with shard_map's replication check off, as
ported code that trips it often sets it.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

BATCH = P("data")  # the batch: rows over "data", the rest whole
COLUMN, ROW = P(None, "tensor"), P("tensor", None)  # kernels (in, out)


def _linear(n_in, n_out, rngs):
    return nnx.Linear(
        n_in, n_out, use_bias=False, kernel_init=nnx.initializers.normal(0.02), rngs=rngs
    )


def _attention_region(x, wq, wk, wv, wo, *, head_dim: int):
    """One device's heads (its columns of q/k/v), its rows of o: the psum of the partial sums."""
    b, t, _ = x.shape
    q, k, v = ((x @ w).reshape(b, t, w.shape[1] // head_dim, head_dim) for w in (wq, wk, wv))
    scores = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(head_dim)
    causal = jnp.tril(jnp.ones((t, t), bool))
    probs = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
    out = jnp.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, -1)
    return jax.lax.psum(out @ wo, "tensor")


def _mlp_region(x, w1, w2, *, bug: str | None, ranks: int):
    if bug == "wrong_rank":  # the last two ranks' column shards crossed
        crossed = {ranks - 2: ranks - 1, ranks - 1: ranks - 2}
        w1 = jax.lax.ppermute(w1, "tensor", [(r, crossed.get(r, r)) for r in range(ranks)])
    partial = jax.nn.gelu(x @ w1, approximate=False) @ w2
    if bug == "missing_psum":
        return partial
    return jax.lax.psum(partial, "data" if bug == "psum_data" else "tensor")


class Attention(nnx.Module):
    def __init__(self, d_model: int, n_heads: int, mesh, rngs: nnx.Rngs):
        self.head_dim, self.mesh = d_model // n_heads, mesh
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            _linear(d_model, d_model, rngs) for _ in range(4)
        )

    def __call__(self, x):
        region = jax.shard_map(
            functools.partial(_attention_region, head_dim=self.head_dim),
            mesh=self.mesh,
            in_specs=(BATCH, COLUMN, COLUMN, COLUMN, ROW),
            out_specs=BATCH,
        )
        kernels = (p.kernel.value for p in (self.q_proj, self.k_proj, self.v_proj, self.o_proj))
        return region(x, *kernels)


class MLP(nnx.Module):
    def __init__(self, d_model: int, d_ff: int, mesh, rngs: nnx.Rngs, bug: str | None = None):
        self.fc1, self.fc2 = _linear(d_model, d_ff, rngs), _linear(d_ff, d_model, rngs)
        self.mesh, self.bug = mesh, bug

    def __call__(self, x):
        region = jax.shard_map(
            functools.partial(_mlp_region, bug=self.bug, ranks=self.mesh.shape["tensor"]),
            mesh=self.mesh,
            in_specs=(BATCH, COLUMN, ROW),
            out_specs=BATCH,
            check_vma=self.bug is None,
        )
        return region(x, self.fc1.kernel.value, self.fc2.kernel.value)


class Block(nnx.Module):
    def __init__(self, d_model, n_heads, d_ff, mesh, rngs, bug=None):
        self.input_layernorm = nnx.RMSNorm(d_model, epsilon=1e-6, rngs=rngs)
        self.attn = Attention(d_model, n_heads, mesh, rngs)
        self.post_attention_layernorm = nnx.RMSNorm(d_model, epsilon=1e-6, rngs=rngs)
        self.mlp = MLP(d_model, d_ff, mesh, rngs, bug)

    def __call__(self, x):
        x = x + self.attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nnx.Module):
    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        d_ff: int,
        ranks: int,
        *,
        mesh,
        rngs: nnx.Rngs,
        region_bug: str | None = None,
    ):
        del seq_len, ranks  # the mesh's "tensor" axis is this side's ranks
        self.embed_tokens = nnx.Embed(
            vocab_size, d_model, embedding_init=nnx.initializers.normal(0.02), rngs=rngs
        )
        self.layers = nnx.List(
            [Block(d_model, n_heads, d_ff, mesh, rngs, region_bug) for _ in range(n_layers)]
        )
        self.norm = nnx.RMSNorm(d_model, epsilon=1e-6, rngs=rngs)
        self.lm_head = _linear(d_model, vocab_size, rngs)

    def __call__(self, tokens):
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def missing_psum(**hparams) -> Decoder:
    return Decoder(**hparams, region_bug="missing_psum")


def psum_over_data(**hparams) -> Decoder:
    return Decoder(**hparams, region_bug="psum_data")


def wrong_rank(**hparams) -> Decoder:
    return Decoder(**hparams, region_bug="wrong_rank")

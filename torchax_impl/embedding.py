"""An embedding's padding_idx under torchax, as eager torch honours it (common/runtime_behaviours.py
`embedding-padding-idx`).

torchax 0.0.13 lowers `aten.embedding` to a gather and differentiates it through JAX, ignoring the
op's padding_idx: the padding row takes a gradient where eager torch's embedding backward gives it
none. `honour_padding_idx` replaces the lowering with one that stops the gradient at the positions
whose index is the padding_idx, for the run that checks whether that behaviour explains a difference
(`--match-behaviours embedding-padding-idx`); every other run keeps torchax's own."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
import torchax

from torchax_impl.batch_norm import install_lowering

OP = torch.ops.aten.embedding.default


def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    rows = jnp.take(weight, indices, axis=0)
    if padding_idx < 0:  # torch's F.embedding makes a negative padding_idx positive; -1 is none
        return rows
    padding = (indices == padding_idx)[..., None]
    return jnp.where(padding, jax.lax.stop_gradient(rows), rows)


def honour_padding_idx(env: torchax.tensor.Environment) -> None:
    """Install the lowering above in `env` (idempotent)."""
    install_lowering(env, OP, _embedding, jax_function=True)

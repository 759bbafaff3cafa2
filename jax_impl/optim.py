"""optax with PyTorch's semantics, built from the spec: every JAX runtime trains with it (the JAX
twin and torchax, which runs the torch model on JAX). Imports jax and optax only, never flax."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from common.spec import TrainSpec


def clip_by_global_norm_like_torch(max_norm: float) -> optax.GradientTransformation:
    """torch.nn.utils.clip_grad_norm_: scale by min(1, max_norm / (norm + 1e-6)).

    optax.clip_by_global_norm omits the 1e-6, which moves gradients by ~1e-6
    relative; parity needs the same formula on both sides.
    """

    def update(grads, state, params=None):
        norm = optax.tree.norm(grads)
        scale = jnp.minimum(1.0, max_norm / (norm + 1e-6))
        return jax.tree.map(lambda g: g * scale.astype(g.dtype), grads), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


class LrTableState(NamedTuple):
    count: jax.Array  # int32: the updates made
    table: jax.Array  # the lr of every step, its last repeated to lr_table_rows(steps)


def lr_table_rows(steps: int) -> int:
    """The table's length: 64 or the next power of two, so that runs of other lengths (or another
    schedule, lr) compile the same train step and find it in the compile cache."""
    return max(64, 1 << (max(steps, 1) - 1).bit_length())


def scale_by_lr_table(train: TrainSpec) -> optax.GradientTransformation:
    """optax.scale_by_learning_rate of the spec's lr per step, read from a table the optimizer state
    holds, in the dtype of the parameters it updates (float64 in a float64 run: torch's lr is a
    Python float): an input of the jitted step, where a schedule's table would be a constant of its
    program. The same numbers as optax's: -lr(step) * update, in the update's dtype."""
    rows = lr_table_rows(train.steps)
    lrs = [train.lr_at(min(s, train.steps - 1)) for s in range(rows)]

    def init(params):
        del params
        return LrTableState(jnp.zeros([], jnp.int32), jnp.asarray(lrs, train.state_dtype))

    def update(updates, state, params=None):
        del params
        step_size = -1 * state.table[jnp.minimum(state.count, rows - 1)]
        updates = jax.tree.map(lambda g: jnp.array(step_size, dtype=g.dtype) * g, updates)
        return updates, LrTableState(optax.safe_increment(state.count), state.table)

    return optax.GradientTransformation(init, update)


def make_optimizer(train: TrainSpec) -> optax.GradientTransformation:
    """torch's AdamW or SGD as optax's own chains, every hyperparameter passed from the spec
    (optax's defaults are not torch's: adamw's weight decay 1e-4 against 0.01), the lr from the
    table (scale_by_lr_table)."""
    parts = [clip_by_global_norm_like_torch(train.grad_clip)] if train.grad_clip > 0 else []
    mask = lambda params: jax.tree.map(lambda p: train.decays(p.ndim), params)  # noqa: E731 (TrainSpec.decays)
    if train.optimizer == "adamw":  # optax.adamw's chain, its lr from the table
        parts.append(
            optax.chain(
                optax.scale_by_adam(b1=train.beta1, b2=train.beta2, eps=train.eps),
                optax.add_decayed_weights(train.weight_decay, mask),
                scale_by_lr_table(train),
            )
        )
    else:  # torch SGD: L2 weight decay added to the gradient before momentum; optax.sgd's chain
        parts.append(optax.add_decayed_weights(train.weight_decay, mask=mask))
        momentum = (
            [optax.trace(decay=train.momentum, nesterov=train.nesterov)] if train.momentum else []
        )
        parts.append(optax.chain(*momentum, scale_by_lr_table(train)))
    return optax.chain(*parts)

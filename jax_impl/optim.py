"""optax with PyTorch's semantics, built from the spec: every JAX runtime trains with it (the JAX
twin and torchax, which runs the torch model on JAX). Imports jax and optax only, never flax."""

from __future__ import annotations

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


def lr_schedule(train: TrainSpec):
    """The spec's lr per step as a table, in the dtype of the parameters it updates (float64 in a
    float64 run: torch's lr is a Python float)."""
    table = jnp.asarray([train.lr_at(s) for s in range(train.steps)], train.state_dtype)
    return lambda count: table[jnp.minimum(count, train.steps - 1)]


def make_optimizer(train: TrainSpec) -> optax.GradientTransformation:
    """Every hyperparameter passed: optax.adamw's default weight decay (1e-4) is not torch's
    (0.01)."""
    parts = [clip_by_global_norm_like_torch(train.grad_clip)] if train.grad_clip > 0 else []
    schedule = lr_schedule(train)
    mask = lambda params: jax.tree.map(lambda p: train.decays(p.ndim), params)  # noqa: E731 (TrainSpec.decays)
    if train.optimizer == "adamw":
        parts.append(
            optax.adamw(
                schedule,
                b1=train.beta1,
                b2=train.beta2,
                eps=train.eps,
                weight_decay=train.weight_decay,
                mask=mask,
            )
        )
    else:  # torch SGD: L2 weight decay added to the gradient before momentum
        parts.append(optax.add_decayed_weights(train.weight_decay, mask=mask))
        parts.append(optax.sgd(schedule, momentum=train.momentum or None, nesterov=train.nesterov))
    return optax.chain(*parts)

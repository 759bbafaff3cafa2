"""BatchNorm's running statistics under torchax, as torch keeps them.

torchax 0.0.13 lowers `aten.native_batch_norm` to JAX and computes the new running mean and
variance, but never writes them back into the running-stat tensors (the op mutates them in eager
torch): a model trained through torchax keeps its initial statistics, and its eval-mode forward is
wrong (measured: a ResNet's running means stay 0; `num_batches_tracked`, an in-place add, does
count). `keep_running_statistics` replaces the lowering with one that runs torchax's own and then
updates the statistics in place with torch's formula (the batch mean, and the unbiased batch
variance, blended by `momentum`), so a functional call over the buffers leaves them updated and the
trainer carries them as step state.

torchax's `Environment.override_op_definition` is the public door, but 0.0.13's omits the operator's
`is_view_op` and raises; the entry is made as it would make it.
"""

from __future__ import annotations

import torch
import torchax
from torchax import interop
from torchax.ops import jaten, ops_registry

OP = torch.ops.aten.native_batch_norm


def _native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out = interop.call_jax(
        jaten._aten_native_batch_norm,
        input,
        weight,
        bias,
        running_mean,
        running_var,
        training,
        momentum,
        eps,
    )
    if training and running_mean is not None and running_var is not None:
        with torch.no_grad():
            x, dims = input.detach(), [0, *range(2, input.ndim)]
            running_mean.mul_(1 - momentum).add_(x.mean(dims), alpha=momentum)
            running_var.mul_(1 - momentum).add_(x.var(dims, correction=1), alpha=momentum)
    return out


def install_lowering(env: torchax.tensor.Environment, op, func, *, jax_function: bool) -> None:
    """`func` as `env`'s lowering of `op` (idempotent): on JAX arrays (`jax_function`) or torchax
    tensors."""
    env._ops[op] = ops_registry.Operator(
        op,
        func,
        is_jax_function=jax_function,
        is_user_defined=True,
        needs_env=False,
        is_view_op=False,
    )


def keep_running_statistics(env: torchax.tensor.Environment) -> None:
    """Install the lowering above in `env` (idempotent)."""
    install_lowering(env, OP, _native_batch_norm, jax_function=False)

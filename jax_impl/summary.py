"""A parity tensor's summary computed where it lives (`--tensors summary|auto` on jax): the
statistics are reduced on the devices over every shard, the sampled values gathered there, and only
those few numbers come to the host. A sharded tensor of a multi-process run is never assembled in
one process, and a large one never copied to host memory whole (common/files/tensor_summary.py
defines the summary; numpy summarizes on the host what another backend holds there).

The reductions run in float32 (JAX without x64; float64 sums on the host), or in float64 for a
float64 run's tensors, judged by float64's bounds: the sum and sum of squares differ from the
host's by rounding, far inside what `summary_checks` allows (n * bound,
sqrt(n) * bound); the largest magnitude, the non-finite count and the sampled values are exact.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from common.files.tensor_summary import TensorSummary, sample_indices
from jax_impl.sharding import to_host


@jax.jit
def _stats(x: jax.Array) -> jax.Array:
    """sum, sum of squares, largest magnitude (over the finite elements) and the non-finite
    count."""
    finite = jnp.isfinite(x)
    # a float64 run's tensors in float64 (its bounds are float64's), any other in float32
    wide = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    f = jnp.where(finite, x, 0).astype(wide)
    return jnp.stack(
        [f.sum(), (f * f).sum(), jnp.abs(f).max(initial=0.0), (~finite).sum().astype(wide)]
    )


@jax.jit
def _take(x: jax.Array, where: tuple) -> jax.Array:
    return x[where]


def device_summary(name: str, x: jax.Array) -> TensorSummary:
    """The summary of canonical tensor `name` (its tensor-file key), equal to
    common.files.tensor_summary.summarize's of the same values in its shape, sampled values, count,
    non-finite count and largest magnitude."""
    shape = tuple(x.shape)
    indices = sample_indices(name, shape)
    total, squares, largest, nonfinite = (float(v) for v in to_host(_stats(x)))
    # each axis < 2**31
    where = tuple(jnp.asarray(i, jnp.int32) for i in np.unravel_index(indices, shape))
    values = to_host(_take(x, where))
    # bfloat16: kept as float32, as the tensor file keeps every array
    if values.dtype.kind not in "biuf":
        values = values.astype(np.float32)
    stats = {
        "count": float(math.prod(shape)),
        "sum": total,
        "sum_sq": squares,
        "max_abs": largest,
        "nonfinite": nonfinite,
    }
    return TensorSummary(shape, stats, indices, values, on_device=True)

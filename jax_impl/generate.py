"""The NNX side's decode path (common/generation.py): the twin's `decode["nnx"]` called on the
model as the run holds it, eagerly, and its training forward beside it."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from common.generation import generate
from common.twin import TwinError, resolve, twin_of
from common.twin.outputs import forward, logits_of


def host_logits(x) -> np.ndarray:
    """Logits on the host in float32 (bfloat16 widened exactly), float64 kept."""
    return np.asarray(x if x.dtype == jnp.float64 else x.astype(jnp.float32))


def nnx_decode_path(spec, model: nnx.Module):
    """(decode, forward) of the NNX side: the twin's own decode function bound to `model`, and the
    training forward's logits, in the torch side's layout (the twin's nnx_output_axes)."""
    twin = twin_of(spec.model)
    if "nnx" not in twin.decode:
        raise TwinError(
            f"--generate: twin {spec.model.twin} names no NNX decode path; give "
            "decode={'nnx': 'file.py:decode'} (README, twin fields)"
        )
    decode = resolve(twin.decode["nnx"], twin.base_dir, "decode")
    model.eval()

    def step(tokens, positions, mask, cache):
        return decode(model, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask), cache)

    def whole(tokens):
        out = logits_of(forward(model, jnp.asarray(tokens)), twin.logits)
        return out.transpose(twin.nnx_output_axes) if twin.nnx_output_axes else out

    return step, whole


def generate_nnx(spec, model: nnx.Module, tokens, mask, n_new: int, forced=None) -> dict:
    """common.generation.generate on the NNX side."""
    step, whole = nnx_decode_path(spec, model)
    return generate(step, host_logits, tokens, mask, n_new, forced, whole)

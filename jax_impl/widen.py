"""A float64 run's casts to float32 inside an NNX model, made float64 (train.float32_casts=widen).

flax's attention computes its softmax in float32 and a port may cast as Hugging Face's code does
(`.astype(jnp.float32)`, `jnp.arange(..., dtype=jnp.float32)`), so a float64 run is float32
there and only float32's bounds can judge it (jax_impl/islands.py). Widened, the traced program
computes in float64 end to end. Every dtype a user's code names passes JAX's one check of user
dtypes, and every conversion its lax one: both are replaced for the rest of the process (the run
is float64 throughout, so no float32 is wanted anywhere) by ones that make float32 float64,
counted per kind, each time a program is traced. The twin of torch_impl/widen.py."""

from __future__ import annotations

import collections

import numpy as np
from jax._src import dtypes
from jax._src.lax import lax as lax_internal

_WIDENED: collections.Counter = collections.Counter()
_ORIGINAL: dict = {}
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def _user_dtype(dtype, fun_name=None):
    checked = _ORIGINAL["user_dtype"](dtype, fun_name)
    if checked == F32:
        _WIDENED[f"{fun_name or 'a'}(dtype=float32)"] += 1
        return F64
    return checked


def _convert(operand, new_dtype=None, *args, **kwargs):
    if new_dtype is not None and new_dtype == F32:
        _WIDENED["convert_element_type(float32)"] += 1
        new_dtype = F64
    return _ORIGINAL["convert"](operand, new_dtype, *args, **kwargs)


def widen_float32_casts() -> None:
    """From now on in this process, every cast to float32 is one to float64 (idempotent)."""
    if not _ORIGINAL:
        _ORIGINAL["user_dtype"] = dtypes.check_and_canonicalize_user_dtype
        _ORIGINAL["convert"] = lax_internal._convert_element_type
        dtypes.check_and_canonicalize_user_dtype = _user_dtype
        lax_internal._convert_element_type = _convert


def stop_widening() -> None:
    """Casts to float32 as written again (a test's process; a run widens to its end). Programs
    traced while widening stay as they were traced: jax.clear_caches() drops them."""
    if _ORIGINAL:
        dtypes.check_and_canonicalize_user_dtype = _ORIGINAL.pop("user_dtype")
        lax_internal._convert_element_type = _ORIGINAL.pop("convert")


def widened() -> collections.Counter:
    """{cast: count} of the casts widened so far in this process (a copy)."""
    return collections.Counter(_WIDENED)


def widen_if_asked(spec) -> None:
    """Widen where the spec asks (train.widens_float32_casts), before the trainer is built: nothing
    of the model is traced or run yet."""
    if spec.train.widens_float32_casts:
        widen_float32_casts()

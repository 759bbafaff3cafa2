"""Step-0 activations of every NNX module, for finding the first module where two ports part.

Each module class's `__call__` is wrapped for one eager forward (restored after): the wrapper records
the module's first input and its output under the module's path (`layers.0.attn`), in the order the
calls complete. flax's `nnx.capture(..., method_outputs=...)` records outputs the same way, but not
inputs, and an input that agrees beside an output that does not is what points at the culprit.
"""
from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from common.correspond import ROOT_MODULE


def _first_array(value):
    if isinstance(value, jax.Array):
        return value
    if isinstance(value, (tuple, list)):
        return next((v for v in value if isinstance(v, jax.Array)), None)
    return None


def capture_activations(model: nnx.Module, inputs) -> dict[str, np.ndarray]:
    """{path: output, path + ':in': first input} of every module, the model itself as ROOT_MODULE."""
    paths = {id(m): ".".join(str(p) for p in path) or ROOT_MODULE for path, m in nnx.iter_modules(model)}
    captured: dict[str, np.ndarray] = {}
    patched = {}
    for cls in {type(m) for _, m in nnx.iter_modules(model)}:
        original = cls.__call__

        def call(self, *args, __original=original, **kwargs):
            out = __original(self, *args, **kwargs)
            path = paths.get(id(self))
            x, y = _first_array(args), _first_array(out)
            if path and y is not None:
                if x is not None:
                    captured.setdefault(f"{path}:in", np.asarray(x, np.float32))
                captured.setdefault(path, np.asarray(y, np.float32))
            return out

        patched[cls] = cls.__dict__.get("__call__")
        cls.__call__ = call
    try:
        model(jax.numpy.asarray(inputs))
    finally:
        for cls, own in patched.items():
            if own is None:
                delattr(cls, "__call__")
            else:
                cls.__call__ = own
    return captured

"""Step-0 activations of every NNX module, for finding the first module where two ports part.

Each module class's `__call__` is wrapped for one eager forward (restored after): the wrapper records
the module's first input and its output under the module's path (`layers.0.attn`), in the order the
calls complete, stored channel-last (common/activations.py: the layout each module's type fixes, or the
rules for the rest). flax's `nnx.capture(..., method_outputs=...)` records outputs the same way, but not
inputs, and an input that agrees beside an output that does not is what points at the culprit.
"""
from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from common.activations import CHANNEL_FIRST, CHANNEL_LAST, Capture, LayoutTracker
from common.modules import ROOT_MODULE

# NNX's layers work on the last axis (a BatchNorm on another `axis` is said by `_own_layout`)
CHANNEL_LAST_TYPES = (nnx.Conv, nnx.ConvTranspose, nnx.Linear, nnx.LinearGeneral, nnx.Einsum, nnx.Embed,
                      nnx.LayerNorm, nnx.RMSNorm, nnx.GroupNorm, nnx.InstanceNorm, nnx.MultiHeadAttention)


def _first_array(value):
    if isinstance(value, jax.Array):
        return value
    if isinstance(value, (tuple, list)):
        return next((v for v in value if isinstance(v, jax.Array)), None)
    if isinstance(value, dict):  # keyword arguments
        return next((v for v in value.values() if isinstance(v, jax.Array)), None)
    return None


def _own_layout(module: nnx.Module) -> str | None:
    if isinstance(module, nnx.BatchNorm):
        return CHANNEL_LAST if module.axis == -1 else CHANNEL_FIRST if module.axis == 1 else None
    return CHANNEL_LAST if isinstance(module, CHANNEL_LAST_TYPES) else None


def capture_activations(model: nnx.Module, inputs, initial_layout: str = CHANNEL_FIRST) -> Capture:
    """{path: output, path + ':in': first input} of every module, the model itself as ROOT_MODULE,
    channel-last; `initial_layout`: the layout `inputs` arrive in (common/activations.input_layout)."""
    modules = list(nnx.iter_modules(model))
    # recorded: the model and every module holding parameters, the modules the torch side can name too
    paths = {id(m): ".".join(str(p) for p in path) or ROOT_MODULE for path, m in modules
             if not path or jax.tree.leaves(nnx.state(m, nnx.Param))}
    leaves = {id(m) for _, m in modules if len(list(nnx.iter_modules(m))) == 1}
    tracker, capture = LayoutTracker(initial_layout), Capture()
    patched = {}
    for cls in {type(m) for _, m in modules}:
        original = cls.__call__

        def call(self, *args, __original=original, **kwargs):
            x = _first_array(args) if _first_array(args) is not None else _first_array(kwargs)
            in_layout = tracker.enter(_own_layout(self), x)
            out = __original(self, *args, **kwargs)
            path, y = paths.get(id(self)), _first_array(out)
            own = CHANNEL_LAST if self is model else _own_layout(self)  # the model's output: as returned
            layout = tracker.leave(own, id(self) in leaves, in_layout, y)
            if path and y is not None:
                if x is not None:
                    tracker.keep(capture, f"{path}:in", np.asarray(x, np.float32), in_layout)
                tracker.keep(capture, path, np.asarray(y, np.float32), layout)
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
    return capture

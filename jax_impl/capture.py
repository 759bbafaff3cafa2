"""Step-0 activations of every NNX module, for finding the first module where two ports part.

Each module class's `__call__` is wrapped for one eager forward (restored after): the wrapper records
the module's first input and its output under the module's path (`layers.0.attn`), in the order the
calls complete, stored channel-last (common/activations.py: the layout each module's type fixes, or the
rules for the rest). flax's `nnx.capture(..., method_outputs=...)` records outputs the same way, but not
inputs, and an input that agrees beside an output that does not is what points at the culprit.

Given the loss, the gradients at the same places are taken as torch's side takes them: zero probes added to
each recorded input and output of a fresh copy of the start model, differentiated by `jax.grad`.
"""
from __future__ import annotations

import contextlib
import functools

import jax
import numpy as np
from flax import nnx

from common.activations import CHANNEL_FIRST, CHANNEL_LAST, Capture, LayoutTracker, replace_first
from common.modules import ROOT_MODULE
from common.outputs import forward

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


def _replace_first(value, new):
    return replace_first(value, new, lambda v: isinstance(v, jax.Array))


def _recorded(model: nnx.Module) -> tuple[dict, set]:
    """({id: path} of the model and every module holding parameters, the modules the torch side can name
    too; the ids of the leaf modules)."""
    modules = list(nnx.iter_modules(model))
    paths = {id(m): ".".join(str(p) for p in path) or ROOT_MODULE for path, m in modules
             if not path or jax.tree.leaves(nnx.state(m, nnx.Param))}
    return paths, {id(m) for _, m in modules if len(list(nnx.iter_modules(m))) == 1}


@contextlib.contextmanager
def _wrapped_calls(model: nnx.Module, around):
    """Every module class's `__call__` replaced for the block by `around(original, self, args, kwargs)`."""
    patched = {}
    for cls in {type(m) for _, m in nnx.iter_modules(model)}:
        original = cls.__call__

        def call(self, *args, __original=original, **kwargs):
            return around(__original, self, args, kwargs)

        patched[cls] = cls.__dict__.get("__call__")
        cls.__call__ = call
    try:
        yield
    finally:
        for cls, own in patched.items():
            if own is None:
                delattr(cls, "__call__")
            else:
                cls.__call__ = own


def capture_activations(model: nnx.Module, inputs, initial_layout: str = CHANNEL_FIRST, loss_of=None) -> Capture:
    """{path: output, path + ':in': first input} of every module, the model itself as ROOT_MODULE,
    channel-last; `initial_layout`: the layout `inputs` arrive in (common/activations.input_layout). With
    `loss_of(output) -> scalar`, `grads` holds the loss's gradient at each of them: the forward runs again
    from the same start under `jax.grad`, a zero probe added to each recorded input and output (the twin
    of torch_impl/capture.py's probes)."""
    start = nnx.split(model)  # the gradient's forward starts where this one did
    paths, leaves = _recorded(model)
    tracker, capture, shapes = LayoutTracker(initial_layout), Capture(), {}

    def keep(key: str, value, layout: str) -> None:
        if value is not None and key not in shapes:
            tracker.keep(capture, key, np.asarray(value, np.float32), layout)
            shapes[key] = (value.shape, value.dtype, layout)

    def record(original, self, args, kwargs):
        x = _first_array(args) if _first_array(args) is not None else _first_array(kwargs)
        in_layout, path = tracker.enter(_own_layout(self), x), paths.get(id(self))
        if path:  # inputs in the order the modules start (the reverse is the order their backward ends)
            keep(f"{path}:in", x, in_layout)
        out = original(self, *args, **kwargs)
        y = _first_array(out)
        own = CHANNEL_LAST if self is model else _own_layout(self)  # the model's output: as returned
        layout = tracker.leave(own, id(self) in leaves, in_layout, y)
        if path:
            keep(path, y, layout)
        return out

    inputs = jax.tree.map(jax.numpy.asarray, inputs)
    with _wrapped_calls(model, record):
        forward(model, inputs)
    if loss_of is not None:
        floating = {k: v for k, v in shapes.items() if jax.numpy.issubdtype(v[1], jax.numpy.floating)}
        # one jitted program: differentiated op by op, gpt-tiny's capture took 2.5x as long (5.4 s vs 2.1 s)
        grads = jax.jit(jax.grad(functools.partial(_probed_loss, start[0], loss_of)))(
            {k: jax.numpy.zeros(shape, dtype) for k, (shape, dtype, _) in floating.items()}, start[1], inputs)
        for key, (_, _, layout) in floating.items():
            tracker.keep_grad(capture, key, np.asarray(grads[key], np.float32), layout)
    return capture


def _probed_loss(graphdef, loss_of, probes: dict, state, inputs):
    """The loss of a copy of the start model (`state`), each recorded module's first input and output plus its
    zero probe (first call only, as recorded)."""
    # Variables made anew in this trace (jax_impl/train.py's in_this_trace): a BatchNorm updating its statistics
    # or a dropout its RNG count refuses a Variable of the outer level
    model = nnx.merge(graphdef, jax.tree.map(lambda leaf: leaf, state))
    paths, _ = _recorded(model)
    added = set()

    def probe(key, value):
        if key in probes and key not in added and value is not None:
            added.add(key)
            return value + probes[key]
        return value

    def call(original, self, args, kwargs):
        path = paths.get(id(self))
        if path:
            in_args = _first_array(args) is not None
            x = _first_array(args) if in_args else _first_array(kwargs)
            if x is not None and f"{path}:in" in probes and f"{path}:in" not in added:
                probed = probe(f"{path}:in", x)
                args, kwargs = (_replace_first(args, probed), kwargs) if in_args else \
                    (args, _replace_first(kwargs, probed))
        out = original(self, *args, **kwargs)
        y = _first_array(out) if path else None
        return _replace_first(out, probe(path, y)) if y is not None and path in probes and path not in added \
            else out

    with _wrapped_calls(model, call):
        return loss_of(forward(model, inputs))

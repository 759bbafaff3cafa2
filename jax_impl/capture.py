"""Step-0 activations of every NNX module, for finding the first module where two ports part.

Each module class's `__call__` is wrapped while the forward traces (restored after): the wrapper
records the module's first input and its output under the module's path (`layers.0.attn`), in the
order the modules start and end, stored channel-last (common/capture/activations.py: the layout each
module's type fixes, or the rules for the rest). flax's `nnx.capture(..., method_outputs=...)`
records outputs the same way, but not inputs, and an input that agrees beside an output that does
not is what points at the culprit.

Given the loss, the gradients at the same places are taken as torch's side takes them: zero probes
added to each recorded input and output of a copy of the start model, differentiated by `jax.grad`
in the same program.
"""

from __future__ import annotations

import contextlib

import jax
import numpy as np
from flax import nnx

from common.capture.activations import (
    CHANNEL_FIRST,
    CHANNEL_LAST,
    FIELD_MARK,
    Capture,
    LayoutTracker,
    count_beyond_first,
    kept_float,
    other_arguments,
    replace_first,
)
from common.twin.modules import ROOT_MODULE
from common.twin.outputs import forward
from jax_impl import sharding
from jax_impl.decisions import PREFIX, decisions_of, watched_decisions

# NNX's layers work on the last axis (a BatchNorm on another `axis` is said by `_own_layout`)
CHANNEL_LAST_TYPES = (
    nnx.Conv,
    nnx.ConvTranspose,
    nnx.Linear,
    nnx.LinearGeneral,
    nnx.Einsum,
    nnx.Embed,
    nnx.LayerNorm,
    nnx.RMSNorm,
    nnx.GroupNorm,
    nnx.InstanceNorm,
    nnx.MultiHeadAttention,
)


def _is_array(value) -> bool:
    return isinstance(value, jax.Array)


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


def recorded_modules(model: nnx.Module) -> tuple[dict, set]:
    """({id: path} of the model and every module holding parameters, the modules the torch side can
    name too; the ids of the leaf modules)."""
    modules = list(nnx.iter_modules(model))
    paths = {
        id(m): ".".join(str(p) for p in path) or ROOT_MODULE
        for path, m in modules
        if not path or jax.tree.leaves(nnx.state(m, nnx.Param))
    }
    return paths, {id(m) for _, m in modules if len(list(nnx.iter_modules(m))) == 1}


@contextlib.contextmanager
def wrapped_calls(model: nnx.Module, around):
    """Every module class's `__call__` replaced for the block by `around(original, self, args,
    kwargs)`."""
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


def capture_activations(
    model: nnx.Module,
    inputs,
    initial_layout: str = CHANNEL_FIRST,
    loss_of=None,
    masks=contextlib.nullcontext,
    call=forward,
) -> Capture:
    """{path: output, path + ':in': first input} of every module, the model itself as ROOT_MODULE,
    channel-last; `initial_layout`: the layout `inputs` arrive in (common/activations.input_layout).
    With `loss_of(output) -> scalar`, `grads` holds the loss's gradient at each of them, taken as
    torch's side takes them (torch_impl/capture.py): a zero probe added to each recorded input and
    output. `masks()`: the context each trace of the forward runs in (common's dropout masks, drawn
    afresh for each). `call(model, inputs)` runs instead of the forward (a decode step).

    Compiled, not op by op: the forward is traced once abstractly (jax.eval_shape: which modules,
    shapes and layouts), then run as one jitted program, under jax.grad when there is a loss. Op by
    op, each primitive compiled a program of its own: 125 compiles, 3.6 s of the UNet's 7.6 s
    capture. The model is not changed (a BatchNorm's statistics, a dropout's RNG count): each trace
    runs a copy of its state."""
    graphdef, state = nnx.split(model)
    inputs = jax.tree.map(jax.numpy.asarray, inputs)
    layouts: dict[str, str] = {}  # key -> layout, in the order the modules were kept
    more_inputs: dict[str, int] = {}  # filled as the forward is traced, as more_outputs
    more_outputs: dict[str, int] = {}
    facts: list[dict] = []  # the decisions of the last trace (jax_impl/decisions.py)

    def values(state, inputs, probes):
        facts.clear()
        with masks():
            output, kept = _probed_forward(
                graphdef,
                state,
                inputs,
                probes,
                LayoutTracker(initial_layout),
                layouts,
                (more_inputs, more_outputs),
                facts,
                call,
            )
        return output, kept

    shapes = jax.eval_shape(lambda s, x: values(s, x, {})[1], state, inputs)
    capture = Capture(more_inputs=more_inputs, more_outputs=more_outputs)
    if loss_of is None:
        kept, grads = jax.jit(lambda s, x: values(s, x, {})[1])(state, inputs), {}
    else:
        floating = {
            k: jax.numpy.zeros(v.shape, v.dtype)
            for k, v in shapes.items()
            if jax.numpy.issubdtype(v.dtype, jax.numpy.floating)
            and not k.startswith(PREFIX)
            and FIELD_MARK not in k
        }  # no probe on a module's other arguments

        def probed_loss(probes, state, inputs):
            output, kept = values(state, inputs, probes)
            return loss_of(output), kept

        grads, kept = jax.jit(jax.grad(probed_loss, has_aux=True))(floating, state, inputs)
    capture.decisions = decisions_of(kept, facts)
    capture.replicas_differ = {
        k: apart for k in layouts if not k.endswith(":in") and (apart := replicas_apart(kept[k]))
    }
    tracker = LayoutTracker(initial_layout)
    for key, layout in layouts.items():
        tracker.keep(capture, key, kept_float(on_host(kept[key])), layout)
    for key, layout in layouts.items():  # in the forward's order (jax returns a dict's keys sorted)
        if key in grads:
            tracker.keep_grad(capture, key, kept_float(on_host(grads[key])), layout)
    return capture


def on_host(value):
    """A captured value whole on the host (gathered from every process where it spans them)."""
    return sharding.to_host(value) if isinstance(value, jax.Array) else value


def replicas_apart(value) -> dict | None:
    """{devices, max_abs} of an array whose replicas differ: the devices whose copy of a part of it
    differs from the first device holding that part (in device order, every process's); None when
    every replica agrees or it has none."""
    if not isinstance(value, jax.Array) or len(value.sharding.device_set) < 2:
        return None
    parts: dict = {}
    for device, where, values in sharding.device_copies(value):
        parts.setdefault(where, []).append((device, np.asarray(values, np.float64)))
    devices, worst = [], 0.0
    for copies in parts.values():
        first = copies[0][1]
        for device, here in copies[1:]:
            if not np.array_equal(first, here, equal_nan=True):
                devices.append(device)
                worst = max(worst, float(np.nanmax(np.abs(here - first))))
    return {"devices": sorted(devices), "max_abs": worst} if devices else None


def _probed_forward(
    graphdef,
    state,
    inputs,
    probes: dict,
    tracker: LayoutTracker,
    layouts: dict,
    more: tuple[dict, dict],
    facts: list,
    run=forward,
):
    """(the output, {key: value}) of a forward of a copy of the model (`state`) that keeps each
    recorded module's first input and output (first call only), plus its probe where `probes` has
    one; with no probes, `layouts` is filled with each kept value's layout, as `tracker` follows
    them; each decision the forward makes is kept too (its facts in `facts`)."""
    # Variables made anew in this trace (jax_impl/train.py's in_this_trace): a BatchNorm updating
    # its statistics or a dropout its RNG count refuses a Variable of the outer level
    model = nnx.merge(graphdef, jax.tree.map(lambda leaf: leaf, state))
    paths, leaves = recorded_modules(model)
    kept = {}
    inside: list[str] = []  # the named modules the forward is in, innermost last

    def keep(key: str, value, layout: str):
        if key in kept:
            return value
        value = value + probes[key] if key in probes else value
        kept[key] = value
        if not probes:
            layouts[key] = layout
        return value

    def call(original, self, args, kwargs):
        in_args = _first_array(args) is not None
        x = _first_array(args) if in_args else _first_array(kwargs)
        in_layout, path = tracker.enter(_own_layout(self), x), paths.get(id(self))
        if path:
            inside.append(path)
        # inputs in the order the modules start
        if path and x is not None and f"{path}:in" not in kept:
            count_beyond_first(more[0], path, args, kwargs, None, _is_array)
            # compare/judge/extra_inputs.py
            for key, v in other_arguments(args, kwargs, _is_array).items():
                if v.size <= x.size:
                    keep(f"{path}:in{FIELD_MARK}{key}", v, in_layout)
            probed = keep(f"{path}:in", x, in_layout)
            if probed is not x:
                args, kwargs = (
                    (_replace_first(args, probed), kwargs)
                    if in_args
                    else (args, _replace_first(kwargs, probed))
                )
        out = original(self, *args, **kwargs)
        if path:
            inside.pop()
        y = _first_array(out)
        # the model's output: as returned
        own = CHANNEL_LAST if self is model else _own_layout(self)
        layout = tracker.leave(own, id(self) in leaves, in_layout, y, x=x)
        if path and y is not None and path not in kept:
            count_beyond_first(more[1], path, (), {}, out, _is_array)
            probed = keep(path, y, layout)
            if probed is not y:
                out = _replace_first(out, probed)
        return out

    where = lambda: inside[-1] if inside else ROOT_MODULE  # noqa: E731
    with wrapped_calls(model, call), watched_decisions(where, kept.__setitem__, facts):
        return run(model, inputs), kept

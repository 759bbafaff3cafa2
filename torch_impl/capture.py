"""Step-0 activations of every torch module, named like the NNX twin's modules (the twin of
`jax_impl/capture.py`: same function name). Forward hooks record each module's first input and its
output, in the order the calls complete, copied when recorded (an in-place ReLU after a BatchNorm
must not rewrite the BatchNorm's output) and stored channel-last (common/capture/activations.py).
Modules called with keyword arguments only (Hugging Face's attention) are recorded too; modules
without an NNX counterpart (a packed `attn.qkv`, say) are left out.

Given the loss, the same forward is differentiated: a zero tensor (a probe) is added to each
recorded input and output, which changes no value, and the probes' gradients after the backward are
the gradients flowing into each module (at its output) and out of it (at its input), its own
backward in between: a custom autograd function or a detach in the wrong place shows there (the NNX
side adds the same probes)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.nn.modules import batchnorm, conv, instancenorm, pooling

from common.capture.activations import (
    CHANNEL_FIRST,
    CHANNEL_LAST,
    FIELD_MARK,
    NEVER_CALLED_REASON,
    Capture,
    LayoutTracker,
    count_beyond_first,
    kept_float,
    other_arguments,
    other_fields,
    replace_first,
)
from common.twin.modules import ROOT_MODULE
from common.twin.outputs import forward
from torch_impl.decisions import DecisionWatch
from torch_impl.models import at_least_float32
from torch_impl.op_layouts import OpLayouts

# layers whose type fixes where their output's channels are (the rest:
# common/capture/activations.py's rules)
CHANNEL_FIRST_TYPES = (
    conv._ConvNd,
    batchnorm._BatchNorm,
    instancenorm._InstanceNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    pooling._MaxPoolNd,
    pooling._AvgPoolNd,
    pooling._AdaptiveAvgPoolNd,
    pooling._AdaptiveMaxPoolNd,
    pooling._LPPoolNd,
    nn.Upsample,
    nn.PixelShuffle,
)
CHANNEL_LAST_TYPES = (
    nn.Linear,
    nn.Bilinear,
    nn.LayerNorm,
    nn.RMSNorm,
    nn.Embedding,
    nn.EmbeddingBag,
    nn.MultiheadAttention,
)


def _is_tensor(value) -> bool:
    return isinstance(value, torch.Tensor)


def _first_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((v for v in value if isinstance(v, torch.Tensor)), None)
    if isinstance(value, dict):  # keyword arguments, or a ModelOutput (a dict)
        return next((v for v in value.values() if isinstance(v, torch.Tensor)), None)
    return None


def _own_layout(module: nn.Module) -> str | None:
    """The layout a module's type fixes; none for a subclass with a forward of its own
    (torchvision's LayerNorm2d: a LayerNorm that permutes NCHW around it), which the rules for other
    modules read."""
    if not getattr(type(module).forward, "__module__", "").startswith("torch."):
        return None
    if isinstance(module, CHANNEL_FIRST_TYPES):
        return CHANNEL_FIRST
    return CHANNEL_LAST if isinstance(module, CHANNEL_LAST_TYPES) else None


def _permuted_view(x, y) -> bool | tuple:
    """Whether `y` reads `x`'s memory in another order (a permute or transpose): the order of `x`'s
    axes it reads them in (y = x.permute(order)) when the strides tell it, else True."""
    # XLA's, torchax's: no storage to read
    if x is None or y is x or x.device.type not in ("cpu", "cuda"):
        return False
    try:
        if y.data_ptr() != x.data_ptr() or y.stride() == x.stride():
            return False
    # a tensor with no host storage (XLA, torchax)
    except (RuntimeError, NotImplementedError, AttributeError):
        return False
    axes = [(x.stride(i), x.shape[i]) for i in range(x.dim())]
    order = tuple(
        axes.index((y.stride(j), y.shape[j])) if (y.stride(j), y.shape[j]) in axes else -1
        for j in range(y.dim())
    )
    return order if len(set(axes)) == len(axes) and sorted(order) == list(range(x.dim())) else True


def _host(t: torch.Tensor) -> np.ndarray:
    return at_least_float32(t).cpu().numpy()


def _replace_first(value, new):
    return replace_first(value, new, lambda v: isinstance(v, torch.Tensor))


class _Probes:
    """Zero tensors added to each named module's first input and output (the forward's values do not
    change), whose gradients after the loss's backward are the gradients flowing out of and into the
    module."""

    def __init__(self, tracker: LayoutTracker):
        self.tracker, self.held = tracker, {}  # key -> (probe, layout)

    def add(self, key: str, x, layout: str):
        if key in self.held or not (isinstance(x, torch.Tensor) and x.is_floating_point()):
            return x
        probe = torch.zeros_like(x, requires_grad=True)
        self.held[key] = (probe, layout)
        probed = x + probe
        self.tracker.by_id[id(probed)] = layout  # the modules it feeds read the probed tensor
        self.tracker.held.append(probed)
        return probed


PROBES_REFUSED = (
    "the step-0 backward was not captured: the model sets requires_grad on a module's input "
    "(Hugging "
    "Face's audio feature encoders do, for gradient checkpointing), which its gradient probe made "
    "a "
    "computed tensor; the forward's activations are captured alone"
)


def probed_or_forward_alone(capture: Callable[[bool], Capture]) -> Capture:
    """`capture(True)`: the activations with the backward's gradient probes; where the model refuses
    them (it sets requires_grad on a module's input, as Hugging Face's audio feature encoders do for
    gradient checkpointing, and the probe made that input a computed tensor), `capture(False)`, the
    forward alone, with a warning. `capture` enters its own contexts (masks, buffers) each time."""
    try:
        return capture(True)
    except RuntimeError as e:
        if "requires_grad flags of leaf variables" not in str(e):
            raise
    print(f"warning: {PROBES_REFUSED}", file=sys.stderr)
    return capture(False)


def _never_called(model: nn.Module, names: dict[str, str], entered: dict) -> dict[str, str]:
    """The named modules holding parameters whose forward never ran (torchvision's attention: its
    parent reads their weights itself), with the reason."""
    return {
        names[n]: NEVER_CALLED_REASON
        for n, m in model.named_modules()
        if names.get(n)
        and id(m) not in entered
        and next(m.parameters(recurse=False), None) is not None
    }


def capture_activations(
    model: torch.nn.Module,
    inputs,
    names: dict[str, str],
    to_numpy=_host,
    sync=None,
    loss_of=None,
    output_layout: str = CHANNEL_LAST,
    impose=None,
    call=forward,
) -> Capture:
    """{canonical module path: output, path + ':in': first input}, channel-last; `names` maps torch
    module names to NNX module paths (torch_impl.convert.modules_to_canonical); `to_numpy` brings a
    runtime's tensor to the host (torchax's are not CPU tensors); `sync` ends a lazy runtime's graph
    (torch_xla's), so that every copy is computed in one graph (fetched one by one, each would
    compile a graph of its own that runs the forward up to its module). The batch arrives
    channel-first, as fed. With `loss_of(output) -> scalar`, the same forward is differentiated too:
    `grads` holds the loss's gradient at each activation. Its top-k, argmax and sort calls are kept
    as `decisions` (torch_impl/decisions.py); `impose`: another side's decisions, taken instead of
    this side's own; `call(model, inputs)` runs instead of the forward (a decode step)."""
    tracker, held = LayoutTracker(CHANNEL_FIRST), {}  # key -> (copied tensor, layout)
    more_inputs, more_outputs, entered = {}, {}, {}  # entered: {id(module): [(input, layout)]}
    inside: list[str] = []  # the named modules the forward is in, innermost last
    watch = DecisionWatch(lambda: inside[-1] if inside else ROOT_MODULE, to_numpy, impose)
    probes = _Probes(tracker) if loss_of is not None else None
    # every tensor's layout from the op that made it (torch_impl/op_layouts.py)
    layouts = OpLayouts(tracker.by_id, tracker.held)
    layouts.feed(inputs, CHANNEL_FIRST)

    def before(name, module, leaf):
        def record(_, args, kwargs):
            if name:
                inside.append(name)
            in_args = _first_tensor(args) is not None
            x = _first_tensor(args) if in_args else _first_tensor(kwargs)
            entered.setdefault(id(module), []).append((x, tracker.enter(_own_layout(module), x)))
            if not name or x is None:
                return None
            layout = entered[id(module)][-1][1]
            if f"{name}:in" not in held:
                count_beyond_first(more_inputs, name, args, kwargs, None, _is_tensor)
                # compared where the other side
                for key, t in other_arguments(args, kwargs, _is_tensor).items():
                    if t.numel() <= x.numel():  # keeps its like (compare/judge/extra_inputs.py)
                        held[f"{name}:in{FIELD_MARK}{key}"] = (t.detach().clone(), layout)
            held.setdefault(f"{name}:in", (x.detach().clone(), layout))
            if probes is None or f"{name}:in" in probes.held:
                return None
            probed = probes.add(f"{name}:in", x, layout)
            # what the module reads (a permuted view is of it)
            entered[id(module)][-1] = (probed, layout)
            return (
                (_replace_first(args, probed), kwargs)
                if in_args
                else (args, _replace_first(kwargs, probed))
            )

        return record

    def after(name, module, leaf):
        def record(_, args, kwargs, out):
            if name:
                inside.pop()
            x, in_layout = entered[id(module)].pop()
            y = _first_tensor(out)
            # the model's output: as returned, or channel-first images
            # (common.capture.activations.torch_output_layout)
            own = output_layout if module is model else _own_layout(module)
            layout = tracker.leave(own, leaf, in_layout, y, leaf and _permuted_view(x, y), x)
            if not name or y is None:
                return None
            if name not in held:
                count_beyond_first(more_outputs, name, (), {}, out, _is_tensor)
                # set beside a port's output of that shape; none larger than the first (an
                # attention's weights)
                for field, t in other_fields(out, _is_tensor).items():
                    if t.shape != y.shape and t.numel() <= y.numel():
                        held[f"{name}{FIELD_MARK}{field}"] = (t.detach().clone(), layout)
            held.setdefault(name, (y.detach().clone(), layout))
            if probes is None or name in probes.held:
                return None
            return _replace_first(out, probes.add(name, y, layout))

        return record

    handles = []
    for n, m in model.named_modules():
        leaf = next(m.children(), None) is None
        handles.append(m.register_forward_pre_hook(before(names.get(n), m, leaf), with_kwargs=True))
        handles.append(m.register_forward_hook(after(names.get(n), m, leaf), with_kwargs=True))
    try:
        with torch.enable_grad() if probes else torch.no_grad():
            with watch, layouts:
                output = call(model, inputs)
            if probes:
                loss_of(output).backward()
    finally:
        for handle in handles:
            handle.remove()
        if probes:
            model.zero_grad(set_to_none=True)  # the analysis leaves no gradient on the parameters
    grads = {
        key: (p.grad if p.grad is not None else torch.zeros_like(p), layout)
        for key, (p, layout) in (probes.held if probes else {}).items()
    }
    if sync is not None:
        held = {key: (at_least_float32(value), layout) for key, (value, layout) in held.items()}
        grads = {key: (at_least_float32(value), layout) for key, (value, layout) in grads.items()}
        sync()
    capture = Capture(
        more_inputs=more_inputs, more_outputs=more_outputs, decisions=watch.decisions()
    )
    capture.skipped.update(_never_called(model, names, entered))
    for key, (value, layout) in held.items():
        tracker.keep(capture, key, kept_float(to_numpy(value)), layout)
    for key, (value, layout) in grads.items():
        tracker.keep_grad(capture, key, kept_float(to_numpy(value)), layout)
    return capture

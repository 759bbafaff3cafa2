"""The layout of each step-0 activation, known from the module that produced it (never guessed from
shapes).

Both sides store their activations channel-last, the canonical (NNX) layout, so compare reads them
as they are. The torch side reads the layout of every tensor its forward makes from the op that
made it (torch_impl/op_layouts.py: a convolution-family op's output is channel-first, everything
else as it is), so a module is known by what it computes. Where no op says (a module that returns
what it was given) and on the NNX side, the layout of a module's output comes from the module:

- a layer whose type fixes it: torch's convolutions, batch/group/instance norms and pools are
  channel-first, its Linear, LayerNorm, Embedding and attention channel-last; NNX's layers are
  channel-last (a BatchNorm on `axis=1` channel-first). Each backend's capture module lists its
  framework's types.
- another module's output passed on as it is (a Sequential, a block ending in its ReLU): that
  module's.
- a module with no submodules and no known type (ReLU, Dropout, GELU): elementwise, so its input's
  where its output keeps the input's shape (unless torch shows its output is a permuted view of its
  input, as torchvision's `Permute`: channel-last when it moves a channel-first tensor's channels
  last, channel-first when it moves them back, else unknown); a new tensor made from an input of
  fewer than 3 dimensions (an embedding of the port's own) as it is; else unknown.
- a module whose output comes from its own code after its last submodule (a residual add): that
  submodule's layout, when the output still has its shape and that layout is known; else its
  input's, when the output has the shape the module was fed (a squeeze-and-excitation gate: its last
  submodule makes the (N, C, 1, 1) scale, its output is that scale times its input; ConvNeXt's
  block, whose body permutes to channel-last and back). When it has neither (the module reshaped or
  transposed it, as a ViT's patch embedding does), its layout is unknown: the activation is not
  stored, and the reason is reported.
- a layer type's layout holds for the type's own forward: a subclass with a forward of its own
  (torchvision's LayerNorm2d, a LayerNorm that permutes NCHW around it) is read by the rules above.

The model's own output is stored as it is returned (the logits, in the task's layout, which both
sides return alike). The stream starts at the layout the side's batch is fed in: channel-first, or
channel-last when the twin transposes the NNX side's inputs to NHWC (`nnx_input_axes`). Layouts only
matter from 3 dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

CHANNEL_FIRST, CHANNEL_LAST, UNKNOWN = "channel_first", "channel_last", "unknown"
# "<module>#<field>": another field of a module's structured output (a ModelOutput's pooler_output,
# a tuple's item 1), kept where its shape differs from the first's: the other side's module may
# return that one (compare/judge/parity.py)
FIELD_MARK = "#"
NEVER_CALLED_REASON = (
    "its forward never ran: its parameters were used directly (e.g. F.linear(x, self.qkv.weight)), "
    "so it has no output of its own to compare"
)
UNKNOWN_REASON = (
    "its layout is unknown: its output was reshaped or transposed by its own code after its "
    "last submodule"
)


def replace_first(value, new, is_array):
    """`value` with its first array (`is_array`: the framework's tensor type) replaced by `new`: the
    value itself, an item of a tuple or list (a named tuple stays one), or of a mapping (a plain
    dict is copied; a dict subclass such as Hugging Face's ModelOutput is set in place, keeping its
    class and fields)."""
    if is_array(value):
        return new
    if isinstance(value, (tuple, list)):
        i = next(i for i, v in enumerate(value) if is_array(v))
        items = [*value[:i], new, *value[i + 1 :]]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    key = next(k for k, v in value.items() if is_array(v))
    if type(value) is dict:
        return {**value, key: new}
    value[key] = new
    return value


def moves_channels_last(axes) -> bool:
    """Whether transposing by `axes` moves axis 1 to the end (NCHW -> NHWC), the rest in order."""
    axes = tuple(axes or ())
    return len(axes) >= 3 and axes == (0, *range(2, len(axes)), 1)


def moves_channels_first(axes) -> bool:
    """Whether transposing by `axes` moves the last axis to 1 (NHWC -> NCHW), the rest in order."""
    axes = tuple(axes or ())
    return len(axes) >= 3 and axes == (0, len(axes) - 1, *range(1, len(axes) - 1))


def input_layout(axes: tuple[int, ...] | None) -> str:
    """The layout a side's batch arrives in: channel-last when its transpose moves axis 1 to the end
    (of a twin's named inputs, {key: axes}: the first it transposes, the image a model's first layer
    reads)."""
    if isinstance(axes, dict):
        axes = next(iter(axes.values()), ())
    return CHANNEL_LAST if moves_channels_last(axes) else CHANNEL_FIRST


def torch_output_layout(nnx_output_axes) -> str:
    """The layout of the torch side's forward output, as the twin's `nnx_output_axes` (the transpose
    that brings the NNX side's output to torch's) tells it: channel-first when it moves the last
    axis to 1 (an NHWC port of a model returning NCHW images), else as returned."""
    return CHANNEL_FIRST if moves_channels_first(nnx_output_axes) else CHANNEL_LAST


def _permuted(axes: tuple, in_layout: str) -> str:
    """The layout of a tensor read with its axes in order `axes` (torchvision's Permute): the
    channel axis moved last from a channel-first tensor is channel-last, moved back from a
    channel-last one channel-first."""
    if moves_channels_last(axes) and in_layout == CHANNEL_FIRST:
        return CHANNEL_LAST
    if moves_channels_first(axes) and in_layout == CHANNEL_LAST:
        return CHANNEL_FIRST
    return UNKNOWN


def kept_float(value) -> np.ndarray:
    """A captured value on the host as the tensor file keeps it: float64 where it was computed in
    float64 (a float64 run), else float32 (bfloat16 widened exactly)."""
    value = np.asarray(value)
    return value if value.dtype == np.float64 else np.asarray(value, np.float32)


def to_channel_last(value: np.ndarray, layout: str) -> np.ndarray:
    if layout == CHANNEL_FIRST and value.ndim >= 3:
        return np.ascontiguousarray(np.moveaxis(value, 1, -1))
    return value


@dataclass
class Capture:
    """One forward's activations: {module: output, module + ':in': first input}, channel-last, and
    the modules left out with the reason; `grads`: the loss's gradient with respect to each of them,
    same keys and layout (a module's output gradient flows into it in the backward pass, its input
    gradient out)."""

    arrays: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    grads: dict = field(default_factory=dict)
    # {module: how many array arguments it was called with besides the first}: those are not
    # compared, so of such a module only "its first input agrees" can be said (HF's MoE experts take
    # the routing's indices and weights beside the hidden states)
    more_inputs: dict = field(default_factory=dict)
    # {module: arrays it returned besides the first (a tuple, dict or ModelOutput)}: the first one's
    # gradient is compared only where it carries one on both sides (HF's router returns logits,
    # scores and indices, and its caller reads the scores: the logits' gradient is zero there, not
    # on a port that returns the logits alone)
    more_outputs: dict = field(default_factory=dict)
    # its top-k, argmax and sort calls (common/capture/decisions.py)
    decisions: list = field(default_factory=list)
    # {module: {"devices": [...], "max_abs": x}}: an output whose replicas (the devices that hold
    # the same part of it) hold other values than the first: a collective left out or over the
    # wrong axis inside a shard_map region (jax_impl/capture.py)
    replicas_differ: dict = field(default_factory=dict)


def other_fields(out, is_array) -> dict:
    """{field: array} of a structured output's arrays after its first: by key (a dict, a
    ModelOutput) or by position (a tuple, a list); empty for one array."""
    items = (
        out.items()
        if isinstance(out, dict)
        else enumerate(out)
        if isinstance(out, (tuple, list))
        else ()
    )
    arrays = [(str(k), v) for k, v in items if is_array(v)]
    return dict(arrays[1:])


def other_arguments(args, kwargs, is_array) -> dict:
    """{position or keyword: array} of a call's array arguments after its first (top level)."""
    arrays = [(str(i), v) for i, v in enumerate(args) if is_array(v)] + [
        (k, v) for k, v in kwargs.items() if is_array(v)
    ]
    return dict(arrays[1:])


def count_beyond_first(found: dict, key: str, args, kwargs, out, is_array) -> None:
    """found[key] = how many arrays a module call had besides the first: of its arguments
    (positional and keyword, top level) when `out` is None, else of what it returned (one array, or
    a tuple, list or dict's); nothing when there are none (Capture.more_inputs, more_outputs)."""
    if out is None:
        items = [*args, *kwargs.values()]
    else:
        items = (
            out.values()
            if isinstance(out, dict)
            else out
            if isinstance(out, (tuple, list))
            else (out,)
        )
    more = sum(map(is_array, items)) - 1
    if more > 0:
        found[key] = more


def _leaf_layout(in_layout: str, shape: tuple, x) -> str:
    """A leaf module of no known type keeps its input's layout where it keeps its shape (an
    activation, a dropout, a norm of its own); one that makes a new tensor from an input of fewer
    than 3 dimensions (an embedding of its own: token ids in, (B, T, D) out) makes it as it is; one
    that reshapes a tensor of 3 or more is unknown."""
    x_shape = tuple(getattr(x, "shape", ()))
    if x is None or shape == x_shape:
        return in_layout
    return CHANNEL_LAST if len(x_shape) < 3 else UNKNOWN


class LayoutTracker:
    """The layout of every tensor a forward's modules pass, by the rules above. A backend calls
    `enter` when a module is called and `leave` when it returns, with the module's own layout (None
    when its type does not fix one); tensors are known by identity, held until the forward ends so
    no id is reused."""

    def __init__(self, initial: str):
        self.current, self.by_id, self.held = initial, {}, []
        self.last_shape: tuple | None = None

    def enter(self, own: str | None, x) -> str:
        return own or self.by_id.get(id(x), self.current)

    def leave(
        self,
        own: str | None,
        leaf: bool,
        in_layout: str,
        y,
        rearranged: bool | tuple = False,
        x=None,
    ) -> str:
        """`rearranged`: the framework sees that `y` is its input's memory read in another order (a
        permute), so an elementwise reading would be wrong: the axes' order when it can tell them (a
        move of the channel axis to the end or back changes the layout; any other order makes it
        unknown); `x`: the module's input."""
        shape = tuple(getattr(y, "shape", ()))
        if own:
            layout = own
        elif id(y) in self.by_id:
            layout = self.by_id[id(y)]
        elif rearranged:
            layout = _permuted(rearranged, in_layout) if isinstance(rearranged, tuple) else UNKNOWN
        elif leaf:
            layout = _leaf_layout(in_layout, shape, x)
        elif shape == self.last_shape and self.current != UNKNOWN:
            layout = self.current
        # a gate, or a residual around a body that permutes and permutes back: shaped as it was fed
        else:
            layout = (
                in_layout if x is not None and shape == tuple(getattr(x, "shape", ())) else UNKNOWN
            )
        if y is not None:
            self.by_id[id(y)] = layout
            self.held.append(y)
        self.current, self.last_shape = layout, shape
        return layout

    def keep(self, capture: Capture, key: str, value: np.ndarray, layout: str) -> None:
        """Store `value` channel-last under `key` (first call only), or say why it cannot be."""
        if key in capture.arrays or key in capture.skipped:
            return
        if layout == UNKNOWN and value.ndim >= 3:
            capture.skipped[key] = UNKNOWN_REASON
        else:
            capture.arrays[key] = to_channel_last(kept_float(value), layout)

    @staticmethod
    def keep_grad(capture: Capture, key: str, value: np.ndarray, layout: str) -> None:
        """The gradient of the activation stored under `key`, in its layout (none where it was left
        out)."""
        if key in capture.arrays:
            capture.grads[key] = to_channel_last(kept_float(value), layout)

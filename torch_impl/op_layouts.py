"""The layout of every tensor a captured forward makes, from the op that made it (the torch side of
common/capture/activations.py's rules, by construction rather than by a module's type).

A convolution-family op (convolutions, pools, batch/group/instance norms, resampling) puts the
channels at axis 1: its output is channel-first. A matrix op (linear, matmul, einsum, an
embedding's lookup) makes a tensor as it is. A permute moves the channel axis with it: moved last
from a channel-first tensor it is channel-last, moved to axis 1 from a tensor as it is it is
channel-first, any other order of a channel-first tensor is unknown. Every other op keeps the layout
of the first tensor of 3 or more dimensions it reads where its output keeps that tensor's batch and
rank (elementwise ops, norms, softmax, padding, slicing, concatenation) or its first two axes (a
flatten of the spatial axes); otherwise its output is as it is (fewer than 3 dimensions, where
layouts do not matter) or unknown (a channel-first tensor reshaped across its channels).
A parameter or buffer no op made is as it is; the batch as fed has the side's initial layout.

So a module that subclasses a stock layer with a forward of its own (Hugging Face's
`Gemma2TextScaledWordEmbedding`: an embedding times a scale) is read by what it computes, never by
the type it inherits."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from common.capture.activations import (
    CHANNEL_FIRST,
    CHANNEL_LAST,
    UNKNOWN,
    moves_channels_first,
    moves_channels_last,
)

# ops whose output has its channels at axis 1 (by name: F.conv2d is torch.conv2d, the Tensor
# methods and functional forms alike)
CHANNEL_FIRST_OPS = frozenset(
    {
        *(f"conv{d}d" for d in (1, 2, 3)),
        *(f"conv_transpose{d}d" for d in (1, 2, 3)),
        "convolution",
        "batch_norm",
        "instance_norm",
        "group_norm",
        "local_response_norm",
        *(f"{p}_pool{d}d" for p in ("max", "avg", "lp") for d in (1, 2, 3)),
        *(f"max_pool{d}d_with_indices" for d in (1, 2, 3)),
        *(f"adaptive_{p}_pool{d}d" for p in ("max", "avg") for d in (1, 2, 3)),
        *(f"adaptive_max_pool{d}d_with_indices" for d in (1, 2, 3)),
        *(f"fractional_max_pool{d}d" for d in (2, 3)),
        *(f"max_unpool{d}d" for d in (1, 2, 3)),
        "interpolate",
        "upsample",
        "upsample_nearest",
        "upsample_bilinear",
        "pixel_shuffle",
        "pixel_unshuffle",
        "channel_shuffle",
        "native_channel_shuffle",
        "grid_sample",
        "fold",
    }
)
# ops that make a tensor as it is, whatever they read
AS_IT_IS_OPS = frozenset(
    {
        "linear",
        "bilinear",
        "matmul",
        "__matmul__",
        "__rmatmul__",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "addbmm",
        "einsum",
        "tensordot",
        "embedding",
        "embedding_bag",
        "scaled_dot_product_attention",
        "multi_head_attention_forward",
    }
)
PERMUTES = frozenset({"permute", "transpose", "swapaxes", "swapdims", "movedim", "moveaxis", "t"})


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _axes(name: str, args, kwargs, ndim: int) -> tuple | None:
    """The order of the input's axes a permute reads them in; None where it cannot be read."""
    rest = list(args[1:])
    try:
        if name == "permute":
            dims = rest[0] if len(rest) == 1 and isinstance(rest[0], (tuple, list)) else rest
            dims = dims or kwargs.get("dims")
            return tuple(int(d) % ndim for d in dims)
        order = list(range(ndim))
        if name == "t":
            return tuple(reversed(order)) if ndim == 2 else tuple(order)
        if name in ("transpose", "swapaxes", "swapdims"):
            a = rest[0] if rest else kwargs.get("dim0", kwargs.get("axis0"))
            b = rest[1] if len(rest) > 1 else kwargs.get("dim1", kwargs.get("axis1"))
            a, b = int(a) % ndim, int(b) % ndim
            order[a], order[b] = order[b], order[a]
            return tuple(order)
        source = rest[0] if rest else kwargs.get("source")
        destination = rest[1] if len(rest) > 1 else kwargs.get("destination")
        source = [source] if isinstance(source, int) else list(source)
        destination = [destination] if isinstance(destination, int) else list(destination)
        moved = [s % ndim for s in source]
        kept = [a for a in order if a not in moved]
        placed: list = [None] * ndim
        for s, d in zip(moved, destination):
            placed[int(d) % ndim] = s
        fill = iter(kept)
        return tuple(a if a is not None else next(fill) for a in placed)
    except (TypeError, ValueError, IndexError):
        return None


def permuted_layout(axes: tuple | None, layout: str) -> str:
    """The layout of a tensor read with its axes in order `axes`."""
    if layout == CHANNEL_FIRST:
        return CHANNEL_LAST if moves_channels_last(axes) else UNKNOWN
    if layout == CHANNEL_LAST:
        return CHANNEL_FIRST if moves_channels_first(axes) else CHANNEL_LAST
    return UNKNOWN


class OpLayouts(TorchFunctionMode):
    """Tags each tensor a forward's ops return with its layout, in `by_id` (the capture's tracker's
    table: {id(tensor): layout}); the tensors are held in `held` until the forward ends, so no id is
    reused. A tensor no op made is as it is (a parameter, a buffer), but for the batch as fed, which
    `feed` tags with the side's initial layout."""

    def __init__(self, by_id: dict, held: list):
        super().__init__()
        self.by_id, self.held = by_id, held

    def feed(self, inputs, layout: str) -> None:
        for t in _tensors(list(inputs.values()) if isinstance(inputs, dict) else inputs):
            if t.dim() >= 3:
                self._tag(t, layout)

    def layout_of(self, t: torch.Tensor) -> str:
        return self.by_id.get(id(t), CHANNEL_LAST)

    def _tag(self, t: torch.Tensor, layout: str) -> None:
        if self.by_id.get(id(t)) != layout:
            self.by_id[id(t)] = layout
            self.held.append(t)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outputs = [t for t in _tensors(out) if t.dim() >= 3]
        if outputs:
            name = getattr(func, "__name__", "").removesuffix("_")
            for y in outputs:
                self._tag(y, self._layout(name, args, kwargs, y))
        return out

    def _layout(self, name: str, args, kwargs, y: torch.Tensor) -> str:
        if name in CHANNEL_FIRST_OPS:
            return CHANNEL_FIRST
        if name in AS_IT_IS_OPS:
            return CHANNEL_LAST
        if name in PERMUTES and args and isinstance(args[0], torch.Tensor):
            x = args[0]
            return permuted_layout(_axes(name, args, kwargs, x.dim()), self.layout_of(x))
        read = _tensors(list(args) + list(kwargs.values()))
        tagged = [t for t in read if t.dim() >= 3 and self.layout_of(t) != CHANNEL_LAST]
        if not tagged:
            return CHANNEL_LAST
        x = tagged[0]
        if (y.dim() == x.dim() and y.shape[0] == x.shape[0]) or y.shape[:2] == x.shape[:2]:
            return self.layout_of(x)
        return UNKNOWN

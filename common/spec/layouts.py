"""How a torch tensor's layout becomes its NNX twin's (the canonical one), and back: numpy only,
exact.

A layout is one of these names, or a rearrangement declared in einops' notation:

  same            the same array
  transpose       2-D reversed (Linear (out, in) -> kernel (in, out))
  conv            (O, I, *k) -> (*k, I, O)  (Conv OIHW -> HWIO; ConvTranspose (in, out, *k)
                  under Flax's `transpose_kernel=True`, which keeps the kernel of the convolution
                  it is the gradient of)
  conv_transpose  (I, O, *k) -> (*k, I, O) with the spatial axes flipped: torch's ConvTranspose
                  weight as `nnx.ConvTranspose` (`transpose_kernel=False`, Flax's default) holds
                  it. torch computes the gradient of a convolution, which correlates with the
                  flipped kernel; `lax.conv_transpose` correlates with the kernel as it is.
  "A -> B"        a rearrangement from torch's tensor to the NNX one: each side lists the axes by
                  name, a parenthesised group being several axes merged into one, e.g.
                  "(h d) e -> h e d" (a q_proj (heads * head_dim, embed) as a heads-first einsum
                  kernel (heads, embed, head_dim)). `1` (or `()`) is an axis of size 1, on either
                  side: "d 1 1 -> d" (ConvNeXt's layer scale, (dim, 1, 1) in torchvision, (dim,)
                  in a JAX port). Axis sizes come from the two shapes.

The derived layouts are the named ones; a rearrangement is declared in a twin (`layouts`), for a
layout no rule can derive.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache

import numpy as np

SAME, TRANSPOSE, CONV, CONV_TRANSPOSE = "same", "transpose", "conv", "conv_transpose"
NAMED = (SAME, TRANSPOSE, CONV, CONV_TRANSPOSE)


class LayoutError(ValueError):
    """A declared layout that cannot be read, or that does not turn one shape into the other."""


def is_rearrangement(layout: str) -> bool:
    return "->" in layout


def torch_axes(layout: str, ndim: int) -> tuple[int, ...]:
    """The canonical axes in torch's order for a named layout: torch tensor =
    canonical.transpose(torch_axes) (and a flip for conv_transpose). One permutation serves arrays,
    shapes and partition specs."""
    if layout == TRANSPOSE:
        return (1, 0)
    if layout == CONV:  # (*k, I, O) -> (O, I, *k)
        return (ndim - 1, ndim - 2, *range(ndim - 2))
    if layout == CONV_TRANSPOSE:  # (*k, I, O) -> (I, O, *k)
        return (ndim - 2, ndim - 1, *range(ndim - 2))
    return tuple(range(ndim))


def torch_shape(layout: str, canonical_shape: tuple) -> tuple:
    """The torch shape of a canonical shape under a named layout."""
    return tuple(canonical_shape[i] for i in torch_axes(layout, len(canonical_shape)))


def _flipped(value: np.ndarray) -> np.ndarray:
    """The spatial axes of a canonical (*k, I, O) kernel reversed (a view)."""
    return value[(slice(None, None, -1),) * (value.ndim - 2)]


def to_torch_layout(value: np.ndarray, layout: str) -> np.ndarray:
    """A canonical array in torch's layout: a view (with negative strides for conv_transpose) for a
    named layout; a rearrangement needs `Rearrangement.to_torch` (it knows the sizes)."""
    value = _flipped(value) if layout == CONV_TRANSPOSE else value
    return value.transpose(torch_axes(layout, value.ndim))


def to_canonical_layout(value: np.ndarray, layout: str) -> np.ndarray:
    value = value.transpose(np.argsort(torch_axes(layout, value.ndim)))
    return _flipped(value) if layout == CONV_TRANSPOSE else value


_GROUP = re.compile(r"\(([^()]*)\)|(\S+)")


def _side(text: str, pattern: str) -> list[tuple[str, ...]]:
    groups = []
    for match in _GROUP.finditer(text):
        if match.group(0) in ("1", "()"):  # an axis of size 1: a group of no names
            groups.append(())
            continue
        names = tuple(match.group(1).split()) if match.group(1) is not None else (match.group(2),)
        if not names or not all(n.isidentifier() for n in names):
            raise LayoutError(
                f"layout {pattern!r}: {match.group(0)!r} is not an axis name or a parenthesised "
                "group "
                "of names"
            )
        groups.append(names)
    return groups


@dataclass(frozen=True)
class Rearrangement:
    """A declared "A -> B" layout, parsed: the torch side's groups of axes and the NNX side's."""

    pattern: str
    torch_groups: tuple
    canonical_groups: tuple

    @staticmethod
    @cache
    def parse(pattern: str) -> Rearrangement:
        if pattern.count("->") != 1:
            raise LayoutError(
                f"layout {pattern!r} must be one of {', '.join(NAMED)} or a rearrangement "
                "'TORCH AXES -> NNX AXES', e.g. '(h d) e -> h e d'"
            )
        left, right = (_side(s, pattern) for s in pattern.split("->"))
        names = [n for g in left for n in g]
        if sorted(names) != sorted(n for g in right for n in g) or len(set(names)) != len(names):
            raise LayoutError(
                f"layout {pattern!r}: each axis must appear once on each side of '->'"
            )
        return Rearrangement(pattern, tuple(left), tuple(right))

    def sizes(self, torch_shape: tuple, canonical_shape: tuple) -> dict[str, int]:
        """Every axis' size from the two shapes, or a LayoutError saying why they do not fit the
        pattern."""
        sides = (
            (self.torch_groups, tuple(torch_shape), "torch"),
            (self.canonical_groups, tuple(canonical_shape), "NNX"),
        )
        for groups, shape, who in sides:
            if len(groups) != len(shape):
                raise LayoutError(
                    f"layout {self.pattern!r}: the {who} side has {len(groups)} axes, its tensor "
                    f"{list(shape)} has {len(shape)}"
                )
        sizes: dict[str, int] = {}
        # each pass settles one group at least
        for _ in range(len(self.torch_groups) + len(self.canonical_groups)):
            for groups, shape, _who in sides:
                for group, total in zip(groups, shape):
                    open_ = [n for n in group if n not in sizes]
                    if len(open_) == 1:
                        known = math.prod(sizes[n] for n in group if n in sizes)
                        sizes[open_[0]] = total // known if known and total % known == 0 else -1
        open_ = sorted({n for g in self.torch_groups for n in g} - set(sizes))
        if open_:
            raise LayoutError(
                f"layout {self.pattern!r} leaves the size of {', '.join(open_)} open for torch "
                f"{list(torch_shape)} and NNX {list(canonical_shape)}"
            )
        for groups, shape, who in sides:
            if any(math.prod(sizes[n] for n in g) != total for g, total in zip(groups, shape)):
                raise LayoutError(
                    f"layout {self.pattern!r} does not turn torch {list(torch_shape)} into NNX "
                    f"{list(canonical_shape)} (the {who} side does not fit)"
                )
        return sizes

    def _axes(
        self, sizes: dict, source: tuple, target: tuple
    ) -> tuple[list[int], list[int], list[int]]:
        names = [n for g in source for n in g]
        order = [n for g in target for n in g]
        return (
            [sizes[n] for n in names],
            [names.index(n) for n in order],
            [math.prod(sizes[n] for n in g) for g in target],
        )

    def to_canonical(self, value: np.ndarray, canonical_shape: tuple) -> np.ndarray:
        split, perm, merged = self._axes(
            self.sizes(value.shape, canonical_shape), self.torch_groups, self.canonical_groups
        )
        return value.reshape(split).transpose(perm).reshape(merged)

    def to_torch(self, value: np.ndarray, torch_shape: tuple) -> np.ndarray:
        split, perm, merged = self._axes(
            self.sizes(torch_shape, value.shape), self.canonical_groups, self.torch_groups
        )
        return value.reshape(split).transpose(perm).reshape(merged)


def check_layout(layout: str) -> None:
    """A declared layout: a named one, or a rearrangement that parses (LayoutError otherwise)."""
    if layout not in NAMED:
        Rearrangement.parse(layout)

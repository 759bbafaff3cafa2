"""The links between a torch model's parameters and its NNX twin's (derived by
common/twin/correspond.py), and the conversion of whole trees (parameters, gradients, partition
specs) along them, both ways: numpy only (or another array module a backend passes), exact."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from common.spec.layouts import (
    CONV_TRANSPOSE,
    Rearrangement,
    is_rearrangement,
    to_canonical_layout,
    to_torch_layout,
    torch_axes,
)
from common.spec.layouts import torch_shape as torch_shape_of


@dataclass(frozen=True)
class Link:
    torch: str
    # several when the torch tensor packs them (split along `axis`)
    canonical: tuple[str, ...]
    layout: str  # a named layout or a declared rearrangement (common/spec/layouts.py)
    # each canonical tensor's shape before the reshape to its own (heads split: (E, H*D) -> (E, H,
    # D)); empty: no reshape
    flat: tuple = ()
    # (start, stop) along torch's dim 0 of the one canonical tensor (in torch layout) that this
    # torch tensor is a part of, when the NNX side packs several torch
    # tensors; empty: the whole tensor
    rows: tuple = ()
    # the torch axis a packed tensor's parts stack along: where its module's outputs lie (0 for
    # nn.Linear's (out, in) and a convolution's (out, in, *k); 1 for HF's Conv1D (in, out))
    axis: int = 0


def packed_axis(layout: str, ndim: int) -> int:
    """The torch axis of a tensor under a named layout that holds the canonical tensor's last axis
    (a kernel's outputs): where the parts of a packed projection stack."""
    return torch_axes(layout, ndim).index(ndim - 1) if ndim else 0


class Correspondence:
    """The links of one twin; converts whole trees (parameters, gradients) both ways."""

    def __init__(
        self,
        links: list[Link],
        canonical: Mapping[str, tuple],
        torch_shapes: Mapping[str, tuple],
        decided: Mapping[str, str] = {},
    ):  # noqa: B006
        self.links = links
        self.canonical_shapes = {k: tuple(v) for k, v in canonical.items()}
        # the layouts declared or taken from module types, by canonical name: what the backends,
        # which see one side's modules only, are given (TwinSpec.layouts)
        self.decided = dict(decided)
        # torch shape of each canonical tensor's source (NNX-packed: the rows stacked)
        self._whole = {}
        for link in links:
            shape = tuple(torch_shapes[link.torch])
            if link.rows:
                shape = (max(link.rows[1], self._whole.get(link.canonical[0], (0,))[0]), *shape[1:])
            self._whole[link.canonical[0]] = shape

    def _canonical_of(
        self, value: np.ndarray, layout: str, name: str, dense=np.ascontiguousarray
    ) -> np.ndarray:
        shape = self.canonical_shapes[name]
        if is_rearrangement(layout):
            return dense(Rearrangement.parse(layout).to_canonical(value, shape))
        return dense(to_canonical_layout(value, layout)).reshape(shape)

    def _torch_of(self, link: Link, i: int, value: np.ndarray) -> np.ndarray:
        if is_rearrangement(link.layout):
            return Rearrangement.parse(link.layout).to_torch(value, self._whole[link.canonical[0]])
        part = to_torch_layout(value.reshape(self._flat(link, i)), link.layout)
        # torch takes no flipped view
        return np.ascontiguousarray(part) if link.layout == CONV_TRANSPOSE else part

    def to_canonical(self, torch_arrays: Mapping[str, np.ndarray], xp=np) -> dict[str, np.ndarray]:
        """{torch name: array} -> {canonical name: array}, in the canonical tree's order. `xp`: the
        arrays' module, numpy, or another with its names (jax.numpy: the tree converted where it
        lives, on the devices)."""
        dense = np.ascontiguousarray if xp is np else (lambda a: a)
        out, stacked = {}, {}
        for link in self.links:
            value = xp.asarray(torch_arrays[link.torch])
            if link.rows:  # one part of an NNX-packed tensor: stacked with its siblings below
                stacked.setdefault(link.canonical[0], []).append((link.rows[0], value, link.layout))
                continue
            parts = (
                [value]
                if len(link.canonical) == 1
                else xp.split(value, self._offsets(link), axis=link.axis)
            )
            for name, part in zip(link.canonical, parts):
                out[name] = self._canonical_of(part, link.layout, name, dense)
        for name, parts in stacked.items():
            whole = xp.concatenate(
                [value for _, value, _ in sorted(parts, key=lambda p: p[0])], axis=0
            )
            out[name] = self._canonical_of(whole, parts[0][2], name, dense)
        return {k: out[k] for k in self.canonical_shapes}

    def torch_parts(self, canonical: Mapping[str, np.ndarray]):
        """(torch name, [its parts in torch layout, as views where a view serves, in order], the
        axis they stack along) per link."""
        for link in self.links:
            parts = [
                self._torch_of(link, i, np.asarray(canonical[n]))
                for i, n in enumerate(link.canonical)
            ]
            yield (
                link.torch,
                [parts[0][slice(*link.rows)]] if link.rows else parts,
                link.axis,
            )

    def _flat(self, link: Link, i: int) -> tuple:
        return link.flat[i] if link.flat else self.canonical_shapes[link.canonical[i]]

    def to_torch(self, canonical: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{canonical name: array} -> {torch name: array} in torch layouts (packed tensors
        concatenated)."""
        return {
            name: np.asarray(
                parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis), order="C"
            )
            for name, parts, axis in self.torch_parts(canonical)
        }

    def _offsets(self, link: Link) -> list[int]:
        sizes = [
            torch_shape_of(link.layout, self._flat(link, i))[link.axis]
            for i in range(len(link.canonical))
        ]
        return list(np.cumsum(sizes)[:-1])

    def torch_partition_specs(self, canonical_specs: Mapping[str, tuple]) -> dict[str, tuple]:
        """Canonical partition specs in torch's layout, keyed by torch name (a packed tensor takes
        its first part's spec)."""
        out = {}
        for link in self.links:
            spec = tuple(canonical_specs[link.canonical[0]])
            # axes reshaped: the torch tensor stays whole (replicated)
            if link.flat or is_rearrangement(link.layout):
                out[link.torch] = (None,) * len(self._whole[link.canonical[0]])
                continue
            spec = tuple(spec[i] for i in torch_axes(link.layout, len(spec)))
            out[link.torch] = spec
        return out

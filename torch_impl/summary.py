"""A parity tensor's summary computed where it lives, by torch ops (`--tensors summary|auto` on
eager torch): the canonical layout is made on the tensor's device, the statistics reduced there and
the sampled values gathered there; only those few numbers reach the host (one copy per tensor),
never the tensor whole. jax_impl/summary.py is the JAX twin; common/files/tensor_summary.py defines
the summary.

torch_xla summarizes on the host: on its device every summary would compile graphs of its own
between the run's, whose order maps each compile to its cause and its HLO
(torch_xla_impl/instrument.py), and its eval-mode forward takes the trained state to the host
anyway.

The reductions run in float32 (numpy's on the host run in float64): the sum and sum of squares
differ from the host's by rounding, which `on_device` tells compare's second pass to allow; the
largest magnitude, the non-finite count and the sampled values are exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from common.files.tensor_file import summarized
from common.files.tensor_summary import TensorSummary, sample_indices
from common.twin.links import Correspondence
from torch_impl.convert import host_float, to_canonical


class _Array:
    """A torch tensor seen through the numpy methods common/twin/links.py and common/spec/layouts.py
    call on an array (`transpose` by a permutation, `reshape`, slicing with negative steps), so that
    they convert it in place."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    @property
    def ndim(self) -> int:
        return self.tensor.dim()

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    def transpose(self, axes) -> _Array:
        # a tuple: a 0-d tensor's is empty
        return _Array(self.tensor.permute(tuple(int(a) for a in axes)))

    def reshape(self, *shape) -> _Array:
        return _Array(self.tensor.reshape(*shape))

    def __getitem__(self, index) -> _Array:
        """Only what layouts._flipped asks: every leading axis reversed (torch has no negative
        steps)."""
        steps = index if isinstance(index, tuple) else (index,)
        if not all(s == slice(None, None, -1) for s in steps):
            raise TypeError(f"unsupported index {index!r}")
        return _Array(self.tensor.flip(tuple(range(len(steps)))) if steps else self.tensor)


class _TorchNumpy:
    """The array module `Correspondence.to_canonical(tree, xp=...)` calls: numpy's names over torch
    tensors."""

    @staticmethod
    def asarray(value) -> _Array:
        return value if isinstance(value, _Array) else _Array(value)

    @staticmethod
    def split(value: _Array, offsets, axis: int = 0) -> list[_Array]:
        return [
            _Array(t) for t in torch.tensor_split(value.tensor, [int(o) for o in offsets], dim=axis)
        ]

    @staticmethod
    def concatenate(values, axis: int = 0) -> _Array:
        return _Array(torch.cat([v.tensor for v in values], dim=axis))


def canonical_on_device(
    tensors: Mapping[str, torch.Tensor], corr: Correspondence
) -> dict[str, torch.Tensor]:
    """{torch name: tensor} -> {canonical name: tensor on the same device, in the canonical
    layout}."""
    converted = corr.to_canonical(
        {k: _Array(v.detach()) for k, v in tensors.items()}, xp=_TorchNumpy
    )
    return {name: value.tensor for name, value in converted.items()}


def device_summary(name: str, x: torch.Tensor) -> TensorSummary:
    """The summary of canonical tensor `name` (its tensor-file key), equal to
    common.files.tensor_summary.summarize's of the same values (as float32) in its shape, sampled
    values, count, non-finite count and largest magnitude."""
    shape = tuple(x.shape)
    indices = sample_indices(name, shape)
    flat = x.detach().reshape(-1)
    finite = torch.isfinite(flat)
    # a float64 run's tensors in float64 (its bounds are float64's), any other in float32
    wide = torch.float64 if flat.dtype == torch.float64 else torch.float32
    zero = torch.zeros((), dtype=flat.dtype, device=flat.device)
    f = torch.where(finite, flat, zero).to(wide)
    largest = f.abs().max() if f.numel() else f.new_zeros(())
    stats = torch.stack([f.sum(), (f * f).sum(), largest, (~finite).sum().to(wide)])
    values = flat[torch.as_tensor(indices, device=flat.device)].to(wide)
    host = torch.cat([stats, values]).cpu().numpy()  # one copy to the host (one graph on torch_xla)
    total, squares, top, nonfinite = (float(v) for v in host[:4])
    stats = {
        "count": float(math.prod(shape)),
        "sum": total,
        "sum_sq": squares,
        "max_abs": top,
        "nonfinite": nonfinite,
    }
    values = np.array(host[4:], np.float64 if wide == torch.float64 else np.float32)
    return TensorSummary(shape, stats, indices, values, on_device=True)


def kept(
    tensors: Mapping[str, torch.Tensor],
    corr: Correspondence,
    group: str,
    mode: str,
    whole=frozenset(),
    on_device: bool | None = None,
) -> dict:
    """{canonical name: host array or summary} of a parity group (`group`) as the tensor file keeps
    it: where a tensor of it is kept as a summary (`mode` "summary", not asked for whole by
    compare's second pass) and the tensors live on an accelerator, the group is converted there and
    those tensors summarized there; else copied to the host and converted there (tensors on the CPU
    already live there: write_tensors summarizes them in float64, which lets compare check a second
    pass bit for bit). `on_device`: decided so when None."""
    if on_device is None:
        on_device = any(t.device.type != "cpu" for t in tensors.values())
    shapes = corr.canonical_shapes
    if not (
        on_device
        and any(summarized(f"{group}/{k}", math.prod(s), mode, whole) for k, s in shapes.items())
    ):
        return to_canonical(tensors, corr)
    canonical = canonical_on_device(tensors, corr)
    return {
        k: device_summary(f"{group}/{k}", v)
        if summarized(f"{group}/{k}", v.numel(), mode, whole)
        else host_float(v)
        for k, v in canonical.items()
    }

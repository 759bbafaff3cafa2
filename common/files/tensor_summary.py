"""A tensor's summary: what a run keeps of a tensor too large to keep whole (`--tensors summary`).

Per tensor, in its canonical name and layout: the element count, sum, sum of squares, largest
magnitude and number of non-finite values, and the values at a sample of element indices drawn from
the tensor's name (the same indices on every backend, whatever its framework: a numpy generator
seeded by the name's CRC-32): SAMPLE_SIZE elements, or for logits LOGIT_ROWS whole rows (a row is a
distribution over the classes, and the distributions are judged on them: compare/judge/parity.py).
That is enough to judge what parity judges element by element, on the sample, and, exactly, what
every element bounds: two tensors that agree element by element within `bound` have norms, sums and
largest magnitudes that agree within what that bound allows (`summary_checks`). Those checks are
necessary conditions, so a summary that fails one fails the whole tensor too, and names its error; a
difference confined to elements outside the sample that moves no norm beyond its bound is what a
summary cannot see.

The file keeps the values and a checksum of the indices, not the indices: they follow from the name
and the shape, and the checksum refuses a summary another sampler drew (`from_arrays`).

Numpy only: each backend summarizes its canonical host arrays one by one as it writes its tensor
file (common/files/tensor_file.py), and compare reads the same file.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

SAMPLE_SIZE = 4096  # values kept per tensor: 16 KiB in float32, whatever the tensor's size
LOGIT_ROWS = 12  # whole rows kept of logits (GPT-2's 50,257 classes: 2.4 MB in float32)
STATS = ("count", "sum", "sum_sq", "max_abs", "nonfinite")


@dataclass(frozen=True)
class TensorSummary:
    shape: tuple[int, ...]
    stats: dict[str, float]  # STATS, over the finite elements (count and nonfinite: over all)
    indices: np.ndarray  # int64, sorted flat indices into the canonical tensor
    values: np.ndarray  # the tensor's values at `indices`
    # reduced on the devices in float32 (jax_impl/summary.py), not on the host in float64
    on_device: bool = False

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


def samples_rows(name: str, shape: tuple[int, ...]) -> bool:
    """Whether a summary of `name` keeps whole rows: logits, whose rows are distributions."""
    return name.rpartition("/")[2] == "logits" and len(shape) >= 2


def sample_indices(name: str, shape: tuple[int, ...], k: int = SAMPLE_SIZE) -> np.ndarray:
    """The flat indices a summary of tensor `name` keeps, sorted: every element up to k, else k
    drawn without replacement by a generator seeded by the name (the same on every backend and in
    every run); of logits, every element of LOGIT_ROWS rows drawn so."""
    size = math.prod(shape)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    if samples_rows(name, shape):
        width = shape[-1]
        rows = size // width if width else 0
        chosen = (
            np.arange(rows)
            if rows <= LOGIT_ROWS
            else np.sort(rng.choice(rows, LOGIT_ROWS, replace=False))
        )
        return (chosen[:, None] * width + np.arange(width)).reshape(-1).astype(np.int64)
    if size <= k:
        return np.arange(size, dtype=np.int64)
    return np.sort(rng.choice(size, k, replace=False)).astype(np.int64)


def summarize(name: str, array) -> TensorSummary:
    """The summary of one canonical tensor (`name`: its key in the tensor file, e.g.
    `grads/h.0.attn.kernel`)."""
    a = np.asarray(array)
    flat = a.reshape(-1)
    finite = (
        flat[np.isfinite(flat)].astype(np.float64)
        if flat.dtype.kind == "f"
        else flat.astype(np.float64)
    )
    stats = {
        "count": float(flat.size),
        "sum": float(finite.sum()),
        "sum_sq": float(np.dot(finite, finite)),
        "max_abs": float(np.max(np.abs(finite))) if finite.size else 0.0,
        "nonfinite": float(flat.size - finite.size),
    }
    indices = sample_indices(name, a.shape)
    return TensorSummary(tuple(a.shape), stats, indices, flat[indices])


def _checksum(indices: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(indices, np.int64).tobytes())


def to_arrays(key: str, summary: TensorSummary) -> dict[str, np.ndarray]:
    """The tensor file's entries of one summary (`key@stats`, `key@shape`, `key@indices`: the
    indices' count and checksum, `key@values`)."""
    made = {f"{key}@on_device": np.array([1], np.int8)} if summary.on_device else {}
    return {
        f"{key}@stats": np.array([summary.stats[s] for s in STATS], np.float64),
        f"{key}@shape": np.array(summary.shape, np.int64),
        f"{key}@indices": np.array([summary.indices.size, _checksum(summary.indices)], np.int64),
        f"{key}@values": summary.values,
        **made,
    }


def from_arrays(key: str, parts: dict[str, np.ndarray]) -> TensorSummary:
    """The summary of `key` from its entries ({"stats", "shape", "indices", "values"}, and
    "on_device" for one reduced on the devices); ValueError when
    malformed, or when its sample is not the one this toolkit draws for that name and shape."""
    stats, shape, indices, values = (parts.get(p) for p in ("stats", "shape", "indices", "values"))
    if (
        any(p is None for p in (stats, shape, indices, values))
        or stats.shape != (len(STATS),)
        or indices.shape != (2,)
        or values.ndim != 1
        or shape.ndim != 1
    ):
        raise ValueError(
            "a summary needs stats (5 numbers), a shape, its sample's count and checksum, and "
            "values"
        )
    shape = tuple(int(n) for n in shape)
    drawn = sample_indices(key, shape)
    if (int(indices[0]), int(indices[1])) != (
        drawn.size,
        _checksum(drawn),
    ) or values.size != drawn.size:
        raise ValueError(
            "its sample is not the one this toolkit draws for it (a tensor file of another "
            "version?)"
        )
    return TensorSummary(
        shape, dict(zip(STATS, (float(x) for x in stats))), drawn, values, "on_device" in parts
    )


def summary_checks(ref: TensorSummary, other: TensorSummary, bound: float) -> dict[str, dict]:
    """What the whole tensors' statistics say against `bound`, the element-wise tolerance (atol +
    rtol * max|ref|): {check: {"ref", "other", "allowed", "within"}}. If every element agreed within
    `bound`, the largest magnitudes would differ by at most `bound`, the L2 norms by at most sqrt(n)
    * bound and the sums by at most n * bound (over the finite elements), and the non-finite counts
      would be equal."""
    n = ref.stats["count"] - ref.stats["nonfinite"]
    pairs = {
        "max_abs": (ref.stats["max_abs"], other.stats["max_abs"], bound),
        "l2_norm": (
            np.sqrt(ref.stats["sum_sq"]),
            np.sqrt(other.stats["sum_sq"]),
            np.sqrt(n) * bound,
        ),
        "sum": (ref.stats["sum"], other.stats["sum"], n * bound),
        "nonfinite": (ref.stats["nonfinite"], other.stats["nonfinite"], 0.0),
    }
    # the sums are float64 over float32 elements: allow their own
    # rounding, never a tolerance of its own
    return {
        name: {
            "ref": float(a),
            "other": float(b),
            "allowed": float(allowed),
            "within": bool(abs(a - b) <= allowed * (1 + 1e-9) + 1e-12 * max(abs(a), abs(b))),
        }
        for name, (a, b, allowed) in pairs.items()
    }

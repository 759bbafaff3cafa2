"""A tensor's summary: what a run keeps of a tensor too large to keep whole (`--tensors summary`).

Per tensor, in its canonical name and layout: the element count, sum, sum of squares, largest magnitude and
number of non-finite values, and the values at SAMPLE_SIZE element indices drawn from the tensor's name (the
same indices on every backend, whatever its framework: a numpy generator seeded by the name's CRC-32). That
is enough to judge what parity judges element by element, on the sample, and, exactly, what every element
bounds: two tensors that agree element by element within `bound` have norms, sums and largest magnitudes
that agree within what that bound allows (`summary_checks`). Those checks are necessary conditions, so a
summary that fails one fails the whole tensor too, and names its error; a difference confined to elements
outside the sample that moves no norm beyond its bound is what a summary cannot see.

Numpy only: each backend summarizes its canonical host arrays one by one as it writes its tensor file
(common/record.py), and compare reads the same file.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

SAMPLE_SIZE = 4096  # values kept per tensor: 16 KiB in float32, whatever the tensor's size
STATS = ("count", "sum", "sum_sq", "max_abs", "nonfinite")


@dataclass(frozen=True)
class TensorSummary:
    shape: tuple[int, ...]
    stats: dict[str, float]  # STATS, over the finite elements (count and nonfinite: over all)
    indices: np.ndarray  # int64, sorted flat indices into the canonical tensor
    values: np.ndarray  # the tensor's values at `indices`

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


def sample_indices(name: str, size: int, k: int = SAMPLE_SIZE) -> np.ndarray:
    """The flat indices a summary of tensor `name` keeps: all of them up to k elements, else k drawn without
    replacement by a generator seeded by the name (the same on every backend and in every run)."""
    if size <= k:
        return np.arange(size, dtype=np.int64)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return np.sort(rng.choice(size, k, replace=False)).astype(np.int64)


def summarize(name: str, array) -> TensorSummary:
    """The summary of one canonical tensor (`name`: its key in the tensor file, e.g. `grads/h.0.attn.kernel`)."""
    a = np.asarray(array)
    flat = a.reshape(-1)
    finite = flat[np.isfinite(flat)].astype(np.float64) if flat.dtype.kind == "f" else flat.astype(np.float64)
    stats = {"count": float(flat.size), "sum": float(finite.sum()), "sum_sq": float(np.dot(finite, finite)),
             "max_abs": float(np.max(np.abs(finite))) if finite.size else 0.0,
             "nonfinite": float(flat.size - finite.size)}
    indices = sample_indices(name, flat.size)
    return TensorSummary(tuple(a.shape), stats, indices, flat[indices])


def to_arrays(key: str, summary: TensorSummary) -> dict[str, np.ndarray]:
    """The tensor file's entries of one summary (`key@stats`, `key@shape`, `key@indices`, `key@values`)."""
    narrow = summary.size < 2 ** 32  # indices in 4 bytes each where they fit
    return {f"{key}@stats": np.array([summary.stats[s] for s in STATS], np.float64),
            f"{key}@shape": np.array(summary.shape, np.int64),
            f"{key}@indices": summary.indices.astype(np.uint32 if narrow else np.int64),
            f"{key}@values": summary.values}


def from_arrays(parts: dict[str, np.ndarray]) -> TensorSummary:
    """A summary from its four entries ({"stats", "shape", "indices", "values"}); ValueError when malformed."""
    stats, shape, indices, values = (parts.get(p) for p in ("stats", "shape", "indices", "values"))
    if any(p is None for p in (stats, shape, indices, values)) or stats.shape != (len(STATS),) \
            or indices.shape != values.shape or indices.ndim != 1:
        raise ValueError("a summary needs stats (5 numbers), shape, and as many indices as values")
    return TensorSummary(tuple(int(n) for n in shape), dict(zip(STATS, (float(x) for x in stats))),
                         indices.astype(np.int64), values)


def summary_checks(ref: TensorSummary, other: TensorSummary, bound: float) -> dict[str, dict]:
    """What the whole tensors' statistics say against `bound`, the element-wise tolerance (atol + rtol *
    max|ref|): {check: {"ref", "other", "allowed", "within"}}. If every element agreed within `bound`, the
    largest magnitudes would differ by at most `bound`, the L2 norms by at most sqrt(n) * bound and the sums by
    at most n * bound (over the finite elements), and the non-finite counts would be equal."""
    n = ref.stats["count"] - ref.stats["nonfinite"]
    pairs = {"max_abs": (ref.stats["max_abs"], other.stats["max_abs"], bound),
             "l2_norm": (np.sqrt(ref.stats["sum_sq"]), np.sqrt(other.stats["sum_sq"]), np.sqrt(n) * bound),
             "sum": (ref.stats["sum"], other.stats["sum"], n * bound),
             "nonfinite": (ref.stats["nonfinite"], other.stats["nonfinite"], 0.0)}
    # the sums are float64 over float32 elements: allow their own rounding, never a tolerance of its own
    return {name: {"ref": float(a), "other": float(b), "allowed": float(allowed),
                   "within": bool(abs(a - b) <= allowed * (1 + 1e-9) + 1e-12 * max(abs(a), abs(b)))}
            for name, (a, b, allowed) in pairs.items()}

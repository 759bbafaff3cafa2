"""Whole tensors of a multi-process run, written where they live: each process writes the shards it
holds.

A tensor a multi-process jax run keeps whole (`--tensors full`, a second pass's keys) lies in pieces
over the processes. Rather than gathering it into every process (each would hold the whole model),
each process writes its distinct shards, with the index range each covers, to
`shards/process-<I>.npz` beside the record, and the record's tensor file (process 0's) marks the
tensor `<key>@sharded` with its shape. A reader assembles one tensor at a time from the shard files,
holding that tensor and one shard.

The shard files belong to their run: process 0 draws a number (broadcast to every process) that each
shard file and the tensor file carry, with the process count; a reader takes exactly that many files
carrying it, each file checked whole (its CRCs) as it opens, and an assembled tensor must be covered
element for element, or the tensor file is refused in one line: shards of another run are never
mixed in.

Numpy only: the jax backend makes the ShardedTensor values (jax_impl/train.py),
common/files/tensor_file.py writes and reads them.
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.files.fsutil import atomic_path

SHARDS_DIR = "shards"
# `<key>@sharded` in the tensor file: the tensor's shape, its values in the shard files
MARK = "sharded"
RUN = "@shards"  # the tensor file's entry: [the run's number, its process count]


@dataclass(frozen=True)
class ShardedTensor:
    """This process's share of one tensor: its distinct shards as ((start, stop) per axis,
    values)."""

    shape: tuple[int, ...]
    pieces: tuple[tuple[tuple[tuple[int, int], ...], np.ndarray], ...]
    process: int
    processes: int
    run: int  # the number process 0 drew for this run


def shard_file(run_dir: Path, process: int) -> Path:
    return Path(run_dir) / SHARDS_DIR / f"process-{process}.npz"


def write_shards(run_dir: Path, groups: dict) -> None:
    """This process's shards of every ShardedTensor in `groups` ({group: {name: value}}), in one
    file written atomically; nothing when there is none."""
    tensors = [
        (f"{g}/{n}", t)
        for g, named in groups.items()
        for n, t in named.items()
        if isinstance(t, ShardedTensor)
    ]
    if not tensors:
        return
    first = tensors[0][1]
    arrays = {RUN: np.array([first.run, first.processes, first.process], np.int64)}
    for key, t in tensors:
        for k, (index, values) in enumerate(t.pieces):
            arrays[f"{key}@{k}"], arrays[f"{key}@{k}@at"] = (
                values,
                np.array(index, np.int64).reshape(-1, 2),
            )
    path = shard_file(run_dir, first.process)
    path.parent.mkdir(exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def tensor_file_entries(key: str, t: ShardedTensor) -> dict[str, np.ndarray]:
    """What the tensor file keeps of a sharded tensor: its mark and shape, and the run its shards
    belong to."""
    return {
        f"{key}@{MARK}": np.array(t.shape, np.int64),
        RUN: np.array([t.run, t.processes], np.int64),
    }


class ShardReader:
    """The shard files of one run, opened and checked; `assemble(key, shape)` one tensor from
    them."""

    def __init__(self, run_dir: Path, run: int, processes: int, fail):
        self._fail, self._files = fail, []
        for process in range(processes):
            path = shard_file(run_dir, process)
            if not path.is_file():  # a process that held no shard of a kept tensor writes none
                continue
            try:
                npz = np.load(path)
                bad = npz.zip.testzip()
                head = npz[RUN]
            except (OSError, ValueError, zipfile.BadZipFile, KeyError, EOFError) as e:
                raise fail(f"shard file {path} is corrupt or truncated: {e}") from None
            if bad is not None:
                raise fail(
                    f"shard file {path} is corrupt or truncated: entry {bad!r} fails its checksum"
                )
            if head.tolist() != [run, processes, process]:
                raise fail(
                    f"shard file {path} belongs to another run (its run {head.tolist()}, this run "
                    f"{[run, processes, process]}); its values are never mixed into this one"
                )
            self._files.append(npz)

    def assemble(self, key: str, shape: tuple[int, ...]) -> np.ndarray:
        out, covered, seen = None, 0, set()
        for npz in self._files:
            k = 0
            while f"{key}@{k}" in npz.files:
                at = npz[f"{key}@{k}@at"]
                index = tuple(slice(int(a), int(b)) for a, b in at)
                if at.shape != (len(shape), 2) or any(
                    not 0 <= s.start < s.stop <= n for s, n in zip(index, shape)
                ):
                    raise self._fail(
                        f"{key}: a shard at {at.tolist()} lies outside its shape {list(shape)}"
                    )
                # a replicated shard: the same values again
                if tuple(map(tuple, at.tolist())) not in seen:
                    seen.add(tuple(map(tuple, at.tolist())))
                    values = npz[f"{key}@{k}"]
                    out = np.empty(shape, values.dtype) if out is None else out
                    out[index] = values
                    covered += values.size
                k += 1
        if out is None or covered != math.prod(shape):
            raise self._fail(
                f"{key}: its shards cover {covered} of its {math.prod(shape)} elements (a "
                "process's "
                "shard file is missing)"
            )
        return out

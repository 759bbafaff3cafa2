"""A run's tensor file, `tensors.npz` beside its record (common/files/record.py): canonical tensors
by group, whole or as summaries (common/files/tensor_summary.py), a multi-process run's whole
tensors in its processes' shard files (common/files/shards.py); written atomically, read lazily and
checked whole as it opens."""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from common.files import shards, tensor_summary
from common.files.fsutil import atomic_path, require_regular_file
from common.files.record import RecordError, RunRecord

TENSORS_FILE = "tensors.npz"
# "state": running statistics by canonical name; "buffers": a model's other buffers and NNX
# Variables after training, by each side's own names (compare links them: common/twin/start_state.py
# by_nnx_names), always whole (a second pass asks for tensors by the names compare gives them)
TENSOR_GROUPS = (
    "outputs",
    "grads",
    "params",
    "state",
    "buffers",
    "eval",
    "activations",
    "activation_grads",
    "decisions",
    "generation",
)
# --tensors: kept whole, or (summary) as summaries (common/files/tensor_summary.py) where larger
# than SUMMARIZED_GROUPS says;
# "auto" is compare's: backends keep summaries, a second pass those leaving tolerance whole
# (compare/runs/second_pass.py)
BACKEND_TENSOR_MODES = ("full", "summary")
TENSOR_MODES = (*BACKEND_TENSOR_MODES, "auto")
SUMMARIZED_GROUPS = {
    **dict.fromkeys(
        ("grads", "params", "state", "activations", "activation_grads"), tensor_summary.SAMPLE_SIZE
    ),
    # group: elements kept whole up to (4 MiB of float32)
    "outputs": 2**20,
    "eval": 2**20,
}


def summarized(key: str, size: int, mode: str, whole=frozenset()) -> bool:
    """Whether tensor `key` (`<group>/<name>`) of `size` elements is kept as a summary in tensor
    mode `mode`."""
    group = key.partition("/")[0]
    return mode == "summary" and size > SUMMARIZED_GROUPS.get(group, size) and key not in whole


def write_tensors(
    run_dir: str | Path,
    groups: dict[str, dict[str, np.ndarray]],
    mode: str = "full",
    whole: frozenset[str] = frozenset(),
) -> str:
    """Save canonical tensors as `<group>/<name>` in one npz, in mode "summary" those of
    SUMMARIZED_GROUPS larger than their group's size as summaries (`<group>/<name>@stats`, ...), one
    at a time, except the keys in `whole` (compare's second pass); returns its relative path."""
    arrays = {}
    for group, tensors in groups.items():
        if group not in TENSOR_GROUPS:
            raise ValueError(f"unknown tensor group {group!r}")
        for name, value in tensors.items():
            key = f"{group}/{name}"
            # summarized where it lives (jax_impl/summary.py)
            if isinstance(value, tensor_summary.TensorSummary):
                arrays.update(tensor_summary.to_arrays(key, value))
                continue
            if isinstance(value, shards.ShardedTensor):  # its values in the processes' shard files
                arrays.update(shards.tensor_file_entries(key, value))
                continue
            value = np.asarray(value)
            # e.g. ml_dtypes' bfloat16, which npz cannot round-trip
            if value.dtype.kind not in "biuf":
                value = value.astype(np.float32)
            if summarized(key, value.size, mode, whole):
                arrays.update(tensor_summary.to_arrays(key, tensor_summary.summarize(key, value)))
            else:
                arrays[key] = value
    with atomic_path(Path(run_dir) / TENSORS_FILE) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
    return TENSORS_FILE


class LazyTensors(Mapping):
    """One group of a tensor file, {name: array or summary}: each array read from the file when
    asked for and not kept, so that compare holds the tensors it is comparing, not every backend's
    whole file (the entries were checked when the file was opened: read_tensors); the summaries,
    small, are held."""

    def __init__(
        self,
        npz,
        keys: dict[str, str],
        summaries: dict,
        order: list[str],
        sharded: dict,
        reader=None,
    ):
        # order: as written
        self._npz, self._keys, self._summaries, self._order = npz, keys, summaries, order
        # {name: (key, shape)}: assembled from shard files
        self._sharded, self._reader = sharded, reader

    def __getitem__(self, name: str):
        if name in self._sharded:
            return self._reader.assemble(*self._sharded[name])
        return self._summaries[name] if name in self._summaries else self._npz[self._keys[name]]

    def __contains__(self, name) -> bool:  # by name, no array read
        return name in self._keys or name in self._summaries or name in self._sharded

    @property
    def summaries(self) -> dict:
        """{name: summary} of the tensors kept as summaries (no array read)."""
        return dict(self._summaries)

    # in the order written, whole or summarized (step 0's activations: the modules' order)
    def __iter__(self):
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._keys) + len(self._summaries)


def _entry_dtype(npz, key: str) -> np.dtype:
    """An npz entry's dtype, from its header (nothing else of it read)."""
    with npz.zip.open(f"{key}.npy") as member:
        version = np.lib.format.read_magic(member)
        header = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        return header(member)[2]


def read_tensors(record_path: str | Path, record: RunRecord) -> dict[str, Mapping]:
    """The tensor file a record points to, as {group: {name: array (read when asked for:
    LazyTensors), or a tensor_summary.TensorSummary}}. The whole file is checked first, streamed
    (every entry's CRC and dtype): a corrupt or foreign file is one RecordError here, not a failure
    in the middle of a report."""
    if not record.tensors:
        raise RecordError(
            f"run record {record_path} has no tensor file (run the backend with --parity)"
        )
    base = Path(record_path)
    path = (base if base.is_dir() else base.parent) / record.tensors
    keys: dict[str, dict[str, str]] = {g: {} for g in TENSOR_GROUPS}
    # names as written, whole or summarized
    order: dict[str, dict[str, None]] = {g: {} for g in TENSOR_GROUPS}
    summaries: dict[tuple[str, str], dict] = {}
    sharded: dict[str, dict] = {g: {} for g in TENSOR_GROUPS}
    # the run and process count of a multi-process run's shard files (common/files/shards.py)
    run = None
    require_regular_file(path, "tensor file", RecordError)
    try:
        npz = np.load(path)
        bad = npz.zip.testzip()
        if bad is not None:
            raise RecordError(
                f"tensor file {path} is corrupt or truncated: entry {bad!r} fails its checksum"
            )
        for key in npz.files:
            if key == shards.RUN:
                run = npz[key].tolist()
                continue
            group, _, name = key.partition("/")
            name, at, part = name.rpartition("@") if "@" in name else (name, "", "")
            if group not in keys or not name:
                raise RecordError(f"tensor file {path} has an unexpected entry {key!r}")
            dtype = _entry_dtype(npz, key)
            if dtype.kind not in "biuf":  # what write_tensors writes: numbers only
                raise RecordError(
                    f"tensor file {path}: entry {key!r} holds {dtype} "
                    "values, not numbers (a tensor file this toolkit did not write)"
                )
            order[group][name] = None
            if part == shards.MARK:
                sharded[group][name] = (f"{group}/{name}", tuple(int(n) for n in npz[key]))
            elif at:
                summaries.setdefault((group, name), {})[part] = npz[key]  # small: read now
            else:
                keys[group][name] = key
        kept: dict[str, dict] = {g: {} for g in TENSOR_GROUPS}
        for (group, name), parts in summaries.items():
            try:
                kept[group][name] = tensor_summary.from_arrays(f"{group}/{name}", parts)
            except ValueError as e:
                raise RecordError(
                    f"tensor file {path}: the summary of {group}/{name} is malformed: {e}"
                ) from None
        reader = (
            shards.ShardReader(path.parent, *run, fail=RecordError)
            if any(sharded.values()) and run
            else None
        )
        if any(sharded.values()) and reader is None:
            raise RecordError(
                f"tensor file {path} marks sharded tensors but names no run of shard files"
            )
        groups: dict[str, Mapping] = {
            g: LazyTensors(npz, keys[g], kept[g], list(order[g]), sharded[g], reader)
            for g in TENSOR_GROUPS
        }
    except FileNotFoundError:
        raise RecordError(f"tensor file {path} does not exist") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        if isinstance(e, RecordError):
            raise
        raise RecordError(f"tensor file {path} is corrupt or truncated: {e}") from None
    return groups

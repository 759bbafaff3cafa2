"""The run records and tensor files a run is judged on, read in one place once each: judged again
after an extra run, the judge reads only the files that run wrote (a file is known by its path and
what stat says of it, so one written again is read again). The CPU's peak, which MFU divides by,
is measured once a run too."""

from __future__ import annotations

import os
from pathlib import Path

from common.files.record import RECORD_FILE, RunRecord, read_record
from common.files.tensor_file import read_tensors
from compare.explain.figures import cpu_peak


def _identity(path: Path) -> tuple | None:
    """The file as stat sees it; None where it cannot (it is read, never kept)."""
    try:
        seen = os.stat(path)
    except OSError:  # read_record / read_tensors say why, in their words
        return None
    return str(path), seen.st_ino, seen.st_size, seen.st_mtime_ns, seen.st_ctime_ns


def _kept(store: dict, key: tuple | None, read):
    """read()'s value, kept in `store` under `key` (None: read, never kept)."""
    if key is None:
        return read()
    if key not in store:
        store[key] = read()
    return store[key]


class Evidence:
    """read_record and read_tensors for one compare run, each file read (and its tensor file's
    checksums streamed) once; the CPU's peak measured once."""

    def __init__(self):
        self._records: dict[tuple, RunRecord] = {}
        self._tensors: dict[tuple, dict] = {}
        self._peaks: dict[tuple, tuple[float, str]] = {}

    def cpu_peak(self, cache_dir: Path | None) -> tuple[float, str]:
        """figures.cpu_peak's (flop/s, where from), looked at by the run's first judging only (a run
        is judged again after each extra run, and each look runs matrix products for a while)."""
        return _kept(self._peaks, (cache_dir,), lambda: cpu_peak(cache_dir))

    def record(self, path: Path) -> RunRecord:
        path = path / RECORD_FILE if path.is_dir() else path
        return _kept(self._records, _identity(path), lambda: read_record(path))

    def tensors(self, path: Path, record: RunRecord) -> dict:
        """The record's tensor groups: a dict of its own (its groups shared, read only)."""
        folder = path if path.is_dir() else path.parent
        # none: read_tensors says what is missing
        key = _identity(folder / record.tensors) if record.tensors else None
        return dict(_kept(self._tensors, key, lambda: read_tensors(path, record)))

"""The run records and tensor files a run is judged on, read in one place once each: judged again
after an extra run, the judge reads only the files that run wrote (a file is known by its path and
what stat says of it, so one written again is read again)."""

from __future__ import annotations

import os
from pathlib import Path

from common.files.record import RECORD_FILE, RunRecord, read_record
from common.files.tensor_file import read_tensors


def _identity(path: Path) -> tuple | None:
    """The file as stat sees it; None where it cannot (it is read, never kept)."""
    try:
        seen = os.stat(path)
    except OSError:  # read_record / read_tensors say why, in their words
        return None
    return str(path), seen.st_ino, seen.st_size, seen.st_mtime_ns, seen.st_ctime_ns


class Evidence:
    """read_record and read_tensors for one compare run, each file read (and its tensor file's
    checksums streamed) once."""

    def __init__(self):
        self._records: dict[tuple, RunRecord] = {}
        self._tensors: dict[tuple, dict] = {}

    def record(self, path: Path) -> RunRecord:
        path = path / RECORD_FILE if path.is_dir() else path
        key = _identity(path)
        if key is None:
            return read_record(path)
        if key not in self._records:
            self._records[key] = read_record(path)
        return self._records[key]

    def tensors(self, path: Path, record: RunRecord) -> dict:
        """The record's tensor groups: a dict of its own (its groups shared, read only)."""
        folder = path if path.is_dir() else path.parent
        key = _identity(folder / record.tensors) if record.tensors else None
        if key is None:  # read_tensors says what is missing
            return read_tensors(path, record)
        if key not in self._tensors:
            self._tensors[key] = read_tensors(path, record)
        return dict(self._tensors[key])

"""Atomic file writes: a reader sees the old file or the whole new one, never half."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside `path`; rename it into place on success.

    The file gets the mode any new file of this process gets (0666 less the
    umask), not mkstemp's private 0600: on a shared TPU VM or behind a web
    server others must be able to read reports, records and checkpoints.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # after the writer: some (safetensors) create the file anew
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json_atomic(path: str | Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n")


def unusable_cache_dir(path: Path) -> dict | None:
    """None when `path` is (or becomes) a writable directory; else the record's `compile_cache` entry saying
    why the run compiles without a cache. A cache is never a reason to fail a run."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        return None
    except OSError as e:
        import sys

        why = f"{path} is not a usable directory ({e.strerror or e}); this run compiled without a cache"
        print(f"warning: compile cache: {why}", file=sys.stderr)
        return {"enabled": False, "dir": str(path), "note": why}

"""Atomic file writes: a reader sees the old file or the whole new one, never half. Which
directories the toolkit must never write into (`dangerous_dir`), and which paths it must not open
for reading (`require_regular_file`: a FIFO or a device would hang it)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
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
        # after the writer: some (safetensors) create the file anew
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def symlink_loop(path) -> bool:
    """Whether `path`, or a folder on the way to it, is a loop of symbolic links (which no open can
    follow)."""
    try:
        Path(path).expanduser().resolve()
    except RuntimeError:  # Python 3.11-3.12 raise it for a loop, 3.13 an OSError
        return True
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


def not_utf8(path) -> str | None:
    """`path`, made absolute, shown with its bytes escaped where it is not UTF-8 (a folder named in
    another encoding); None where it is."""
    full = os.path.abspath(os.fspath(path))
    try:
        full.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(full).decode("utf-8", "backslashreplace")
    return None


def dangerous_dir(path: str | Path) -> str | None:
    """Why the toolkit must never write or remove in `path` (None when it may): the filesystem root,
    the home directory, the current directory or one of its parents, this checkout or one of its
    parents. An output there would mix the toolkit's files with the user's, and replacing it would
    remove theirs."""
    target = Path(path).expanduser().resolve()
    checkout = Path(__file__).resolve().parents[2]
    cwd = Path.cwd().resolve()
    if target == Path(target.anchor):
        return "is the filesystem root"
    if target == Path.home().resolve():
        return "is the home directory"
    if target == checkout or target in checkout.parents:
        return (
            "is this toolkit's checkout"
            if target == checkout
            else "is a parent of this toolkit's checkout"
        )
    if target == cwd or target in cwd.parents:
        return (
            "is the current directory" if target == cwd else "is a parent of the current directory"
        )
    return None


def require_regular_file(
    path: str | Path, what: str, error: type[Exception] = ValueError, *, directory_ok: bool = False
) -> Path:
    """`path`, checked before the toolkit opens it for reading: a regular file (or, with
    `directory_ok`, a directory) passes, and so does a path that does not exist (the caller's own
    open says so, in its words); anything else raises `error("<what> PATH is not a regular file (a
    FIFO); give a file")`. Opening a FIFO for reading waits for a writer, forever; a device
    (/dev/zero) never ends."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    # missing, unreadable, a NUL in the name: the caller's open reports it
    except (OSError, ValueError):
        return path
    if stat.S_ISREG(mode) or (directory_ok and stat.S_ISDIR(mode)):
        return path
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    kind = next((name for test, name in kinds if test(mode)), "not a file")
    wanted = " or a directory" if directory_ok else ""
    raise error(
        f"{f'{what} ' if what else ''}{path} is not a regular file{wanted} ({kind}); give a "
        f"file{wanted}"
    )


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json_atomic(path: str | Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n")


def unusable_cache_dir(path: Path) -> dict | None:
    """None when `path` is (or becomes) a writable directory; else the record's `compile_cache`
    entry saying why the run compiles without a cache. A cache is never a reason to fail a run."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        return None
    except OSError as e:
        import sys

        why = (
            f"{path} is not a usable directory ({e.strerror or e}); this run compiled without a "
            "cache"
        )
        print(f"warning: compile cache: {why}", file=sys.stderr)
        return {"enabled": False, "dir": str(path), "note": why}

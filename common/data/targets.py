"""Where `python -m compare.convert --to FORMAT:PATH` writes: never over what the user had.

A file target (`torch:`, `canonical:`) that exists is refused unless `--overwrite`; the new file is
written beside it under a temporary name and moved into place (without `--overwrite` by a hard link,
which fails rather than replace a file that appeared meanwhile). A directory target (`orbax:`) must
be new, empty, or a checkpoint this toolkit wrote: one holding MARKER, which lists the entries the
checkpoint wrote. Replacing one needs `--overwrite` and removes only the entries its marker lists
(files a user put beside them stay). The new checkpoint is written into a temporary directory beside
the target and moved into place, so a failure leaves the target as it was. A dangerous directory
(`common.files.fsutil.dangerous_dir`: `/`, the home, the current directory, the checkout, their
parents) is refused whatever it holds.

Refusals are `TargetError` (an input error: exit 2); a write that fails (disk full, a directory that
cannot be written) is `TargetWriteError` (exit 7), after removing what it had written.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

from common.files.fsutil import dangerous_dir, require_regular_file, write_json_atomic
from common.weights import CheckpointError

MARKER = ".xla-twins-checkpoint.json"
EMPTY_HINT = "give a new or empty directory"


class TargetError(CheckpointError):
    """A target the toolkit will not write to; one line, exit 2."""


class TargetWriteError(Exception):
    """Writing the target failed (disk full, an unwritable path); one line, exit 7. Nothing is left
    behind."""


def write_failed(path: Path, error: BaseException) -> TargetWriteError:
    why = getattr(error, "strerror", None) or (str(error).splitlines() or [type(error).__name__])[0]
    where = getattr(error, "filename", None)
    # not our temp file
    if where and Path(where) != path and not Path(where).name.startswith(f".{path.name}."):
        why += f": {where}"
    return TargetWriteError(
        f"cannot write the checkpoint to {path}: {why} (disk full, or a path that cannot be "
        "written); nothing was written: free space or give another target"
    )


def _kind(path: Path) -> str | None:
    """None for a path that does not exist; else 'file', 'dir' or what else it is."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except NotADirectoryError:  # a parent is a file: the write will fail and say so (exit 7)
        return None
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return (
        "not a regular file ("
        + ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device")
        + ")"
    )


def check_file_target(path: Path, overwrite: bool, flag: str) -> None:
    """Refuse a file target the write must not replace (see the module docstring)."""
    kind = _kind(path)
    if kind == "dir":
        raise TargetError(f"{flag}: {path} is a directory; give the path of a file to write")
    if kind not in (None, "file"):
        raise TargetError(f"{flag}: {path} is {kind}; give the path of a file to write")
    if kind == "file" and not overwrite:
        raise TargetError(
            f"{flag}: {path} already exists; pass --overwrite to replace it, or give another file"
        )


def _some(names: list[str], shown: int = 4) -> str:
    more = f", and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _our_entries(path: Path) -> list[str] | None:
    """The entries the checkpoint in `path` wrote (its marker's list), or None when it has no valid
    marker."""
    marker = path / MARKER
    try:
        data = json.loads(require_regular_file(marker, "marker", OSError).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    entries = (
        data.get("entries")
        if isinstance(data, dict) and data.get("written_by") == "xla-twins"
        else None
    )
    if not isinstance(entries, list) or not all(
        isinstance(e, str) and e not in ("", ".", "..", MARKER) and "/" not in e and "\\" not in e
        for e in entries
    ):
        return None
    return entries


def check_dir_target(path: Path, overwrite: bool, flag: str) -> list[str]:
    """Refuse a directory target the write must not touch (see the module docstring); returns the
    entries of the checkpoint of ours it replaces (empty for a new or empty directory)."""
    why = dangerous_dir(path)
    if why:
        raise TargetError(f"{flag}: {why}; {EMPTY_HINT}, e.g. runs/my-checkpoint")
    kind = _kind(path)
    if kind is None:
        return []
    if kind != "dir":
        raise TargetError(
            f"{flag}: {path} is {'a file' if kind == 'file' else kind}, not a directory; "
            f"{EMPTY_HINT}"
        )
    names = sorted(os.listdir(path))
    if not names:
        return []
    ours = _our_entries(path)
    if ours is None:
        shown = [
            f"{n}/" if (path / n).is_dir() and not (path / n).is_symlink() else n for n in names
        ]
        raise TargetError(
            f"{flag}: {path} is not empty (holds {_some(shown)}) and is not a checkpoint this "
            "toolkit "
            f"wrote; {EMPTY_HINT}"
        )
    if not overwrite:
        raise TargetError(
            f"{flag}: {path} already holds a checkpoint this toolkit wrote; pass --overwrite to "
            "replace it, or give another directory"
        )
    return [e for e in ours if os.path.lexists(path / e)] + [MARKER]


def _make_parent(path: Path) -> None:
    """The target's parent directories (mkdir says 'File exists' of a file in the way: say what it
    is)."""
    for parent in reversed(path.parents):
        if os.path.lexists(parent) and not parent.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(parent))
    path.parent.mkdir(parents=True, exist_ok=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def file_target(path: str | Path, overwrite: bool, flag: str):
    """Yield a temporary path beside `path` to write the file to; on success it takes `path`'s
    place. Raises TargetError (refused) or TargetWriteError (the write failed; nothing left
    behind)."""
    path = Path(path)
    check_file_target(path, overwrite, flag)
    tmp = None
    try:
        _make_parent(path)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        yield tmp
        # after the writer: some (safetensors) create the file anew
        os.chmod(tmp, 0o666 & ~_umask())
        check_file_target(path, overwrite, flag)  # again: a file may have appeared meanwhile
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)  # fails, never replaces, if a file appeared since the check
            except FileExistsError:
                raise TargetError(
                    f"{flag}: {path} already exists; pass --overwrite to replace it, or give "
                    "another "
                    "file"
                ) from None
            # a filesystem without hard links (FAT, some FUSE mounts): checked just above
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                    raise
                os.replace(tmp, path)
    except OSError as e:
        raise write_failed(path, e) from None
    finally:
        if tmp is not None and os.path.lexists(tmp):
            tmp.unlink()


@contextlib.contextmanager
def checkpoint_dir(path: str | Path, overwrite: bool, flag: str):
    """Yield a new temporary directory beside `path` to write a checkpoint into; on success its
    entries, with a marker listing them, take `path`'s place (see the module docstring). Raises
    TargetError (refused) or TargetWriteError (the write failed; the target is left as it was)."""
    path = Path(path)
    check_dir_target(path, overwrite, flag)
    tmp = None
    try:
        _make_parent(path)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        yield tmp
        entries = sorted(os.listdir(tmp))
        write_json_atomic(
            tmp / MARKER,
            {
                "written_by": "xla-twins",
                "entries": entries,
                "note": "the entries this checkpoint wrote: what --overwrite replaces",
            },
        )
        # mkdtemp's 0700 would hide the checkpoint from other users
        os.chmod(tmp, 0o777 & ~_umask())
        old = check_dir_target(path, overwrite, flag)  # again, just before the move
        if _kind(path) is None:
            os.rename(tmp, path)  # the whole checkpoint appears at once
        else:
            _swap(path, tmp, old, entries + [MARKER])
    except OSError as e:
        raise write_failed(path, e) from None
    finally:
        # the write failed (on success it was moved into place)
        if tmp is not None and os.path.lexists(tmp):
            _remove_settled(tmp)


def _remove_settled(tmp: Path, settle_s: float = 0.3, limit_s: float = 3.0) -> None:
    """Remove `tmp`, and again should a writer's thread still running make it anew (orbax's go on
    after a failed save, and one made `state.orbax-checkpoint-tmp/ocdbt.process_0` in it after its
    first removal): until it has stayed away for `settle_s`, for `limit_s` at most."""
    deadline = time.monotonic() + limit_s
    while True:
        shutil.rmtree(tmp, ignore_errors=True)
        gone = time.monotonic()
        while not os.path.lexists(tmp) and time.monotonic() - gone < settle_s:
            time.sleep(0.02)
        if not os.path.lexists(tmp) or time.monotonic() > deadline:
            return


def _swap(path: Path, tmp: Path, old: list[str], new: list[str]) -> None:
    """Move `old` entries of `path` aside, `new` ones from `tmp` in; on a failure, put everything
    back."""
    clash = [n for n in new if n not in old and os.path.lexists(path / n)]
    if clash:
        raise TargetError(
            f"{path} holds {_some(clash)}, which the new checkpoint would write over and the old "
            "one "
            f"did not write; move it away or {EMPTY_HINT}"
        )
    trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", suffix=".tmp", dir=path.parent))
    moved_out, moved_in = [], []
    try:
        for name in old:
            os.rename(path / name, trash / name)
            moved_out.append(name)
        for name in new:
            os.rename(tmp / name, path / name)
            moved_in.append(name)
    except OSError:
        for name in moved_in:
            os.rename(path / name, tmp / name)
        for name in moved_out:
            os.rename(trash / name, path / name)
        shutil.rmtree(trash, ignore_errors=True)
        raise
    shutil.rmtree(trash, ignore_errors=True)

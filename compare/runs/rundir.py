"""A run directory belongs to one compare run, and compare removes only what a run of its own wrote.

`claim` is called before anything is written. It refuses a dangerous `--out` (`.`, `~`, `/`, the
checkout or a parent of it) and a directory holding files this toolkit did not write; takes an
exclusive lock (a second compare on the same `--out` is refused while the first runs); and writes
the marker `.xla-twins-run.json`: the run's id, its pid, its state (`running` until the report is
written, then `finished`) and the top-level entries it may write. When the run finishes, the marker
lists every file it wrote.

Replacing an earlier run (`--overwrite` for a finished one; a run that never finished, killed,
needs no flag and is reported) removes exactly that run's files: the listed files of a finished
run, the listed entries of a killed one. Files a user put beside them stay.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from common.files.fsutil import dangerous_dir, require_regular_file, write_json_atomic

MARKER = ".xla-twins-run.json"
LOCK = ".xla-twins-run.lock"
OWN = {MARKER, LOCK}
# the prepared common start (a user twin, a torch / hf checkpoint) in the run directory
START_DIR = "start"
RUN_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class RunDirError(ValueError):
    """A run directory compare will not use; one line."""


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def default_out(run_id: str) -> Path:
    """runs/compare-<time>-<run id>: two runs started in the same second still get directories of
    their own."""
    return Path("runs") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}-{run_id[:6]}"


def check_run_id(run_id: str) -> str:
    if not run_id or len(run_id) > 64 or not set(run_id) <= RUN_ID_CHARS:
        raise RunDirError(f"--run-id {run_id!r}: use 1 to 64 letters, digits, '-', '_' or '.'")
    return run_id


@dataclass
class RunDir:
    path: Path
    run_id: str
    entries: list[str]
    replaced: dict | None  # the earlier run this one replaced: {run_id, state, started_at, pid}
    _lock_fd: int

    def finish(self, status: str) -> None:
        """Mark the run finished and list every file it wrote (what a later --overwrite removes)."""
        marker = _read_marker(self.path) or {}
        marker.update(state="finished", status=status, finished_at=time.time(), files=self.files())
        try:
            write_json_atomic(self.path / MARKER, marker)
        # the report is written; a later run will see this one as unfinished and say so
        except OSError as e:
            print(f"warning: cannot mark {self.path} finished ({e.strerror or e})", file=sys.stderr)

    def files(self) -> list[str]:
        found = []
        for entry in self.entries:
            top = self.path / entry
            if top.is_symlink() or top.is_file():
                found.append(entry)
            elif top.is_dir():
                for root, dirs, names in os.walk(top):
                    found += [os.path.relpath(os.path.join(root, n), self.path) for n in names]
                    dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
        return sorted(found)


def check(out: Path, overwrite: bool, backend_folders: list[str] = ()) -> None:
    """The refusals of `claim` that need no write: made before compare prepares anything, so a run
    that will be refused costs nothing and leaves nothing. `backend_folders`: the top-level entries
    in which this run's backends will run (each refuses a folder holding files not its own)."""
    why = dangerous_dir(out)
    if why:
        raise RunDirError(
            f"--out {out}: {why}; give the run a directory of its own, e.g. --out runs/my-run"
        )
    if out.exists() and not out.is_dir():
        raise RunDirError(
            f"run directory {out} is not writable (Not a directory); pass a writable --out"
        )
    if out.is_dir():
        foreign = sorted(set(os.listdir(out)) - OWN)
        if foreign and not (out / MARKER).exists():
            raise RunDirError(
                f"--out {out} holds files this toolkit did not write ({_some(foreign)}); pass a "
                "new "
                "or empty directory"
            )
        marker = _read_marker(out)
        _refuse_finished(out, marker, overwrite)
        _refuse_foreign_inside(out, marker, backend_folders)
        if (out / LOCK).exists():
            _lock(os.open(out / LOCK, os.O_RDONLY | os.O_CLOEXEC), out, release=True)


def claim(
    out: Path, run_id: str, entries: list[str], overwrite: bool, inputs: dict[str, Path]
) -> RunDir:
    """Make `out` this run's directory (see the module docstring); `inputs`: {flag: path} this run
    reads, which must not lie in what an --overwrite would remove."""
    check(out, overwrite)
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as e:
        raise RunDirError(
            f"run directory {out} is not writable ({e.strerror or e}); pass a writable --out"
        ) from None
    _lock(fd, out)
    try:
        replaced = _replace_earlier(out, overwrite, inputs)
        write_json_atomic(
            out / MARKER,
            {
                "run_id": run_id,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started_at": time.time(),
                "state": "running",
                "entries": entries,
                "argv": sys.argv[1:],
            },
        )
    except OSError as e:
        os.close(fd)
        raise RunDirError(
            f"run directory {out} is not writable ({e.strerror or e}); pass a writable --out"
        ) from None
    except RunDirError:
        os.close(fd)
        raise
    return RunDir(out, run_id, entries, replaced, fd)


def _lock(fd: int, out: Path, release: bool = False) -> None:
    """Hold an exclusive lock on `fd` (released when the process ends, however it ends), or
    refuse."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        other = _read_marker(out) or {}
        # a multi-host run's hosts
        hosts = "--host-id" in (other.get("argv") or []) or "--host-id" in sys.argv
        raise RunDirError(
            f"another compare (pid {other.get('pid', '?')}, run {other.get('run_id', '?')}) is "
            f"writing to {out}; "
            + (
                "each host of a multi-host run writes its own --out: pass this host another one"
                if hosts
                else "wait for it to finish or pass another --out"
            )
        ) from None
    if release:
        os.close(fd)


def _replace_earlier(out: Path, overwrite: bool, inputs: dict[str, Path]) -> dict | None:
    marker = _read_marker(out)
    if marker is None:
        return None
    # again under the lock: it may have finished since `check`
    _refuse_finished(out, marker, overwrite)
    finished = marker.get("state") == "finished"
    doomed = [
        out / p
        for p in (marker.get("files") if finished else marker.get("entries")) or []
        if _inside(out / p, out)
    ]
    for flag, path in inputs.items():
        if any(_inside(Path(path), d) or _inside(d, Path(path)) for d in doomed):
            raise RunDirError(
                f"{flag} {path} is part of the run in {out} that this one would replace; copy it "
                "elsewhere first or pass another --out"
            )
    for path in doomed:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.is_symlink() or path.exists():
            path.unlink()
    # directories the earlier run made, now empty; its temp files
    for entry in marker.get("entries") or []:
        _prune_empty(out / entry, out)
        for tmp in out.glob(f".{entry}.*.tmp"):
            tmp.unlink()
    return {k: marker.get(k) for k in ("run_id", "state", "started_at", "pid")}


def _refuse_finished(out: Path, marker: dict | None, overwrite: bool) -> None:
    if marker and marker.get("state") == "finished" and not overwrite:
        raise RunDirError(
            f"{out} already holds a finished run (report.json); pass --overwrite or another --out"
        )


def _refuse_foreign_inside(out: Path, marker: dict | None, folders: list[str]) -> None:
    """A finished run lists its files: one of the user's inside a folder a backend of this run will
    run in would stop that backend (driver/backend_main.py refuses it) after the earlier run was
    removed and the other backends had run. Refused first, so that nothing is removed and nothing
    runs. Beside the run's files, and in the folder of a backend whose record is reused, a file of
    the user's stays, as it is. (A killed run lists no files: its entries are all its own.)"""
    if not marker or marker.get("state") != "finished":
        return
    listed, foreign = set(marker.get("files") or []), []
    for entry in folders:
        top = out / entry
        if not top.is_dir() or top.is_symlink():
            continue
        for root, dirs, names in os.walk(top):
            foreign += [
                rel
                for n in names
                if (rel := os.path.relpath(os.path.join(root, n), out)) not in listed
            ]
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
    if foreign:
        raise RunDirError(
            f"--out {out}: {_some(sorted(foreign))} inside the run's own folders are not this "
            "toolkit's; move them out of the run or pass another --out"
        )


def _prune_empty(top: Path, out: Path) -> None:
    if not top.is_dir() or top.is_symlink() or not _inside(top, out):
        return
    for root, _, _ in os.walk(top, topdown=False):
        try:
            os.rmdir(root)
        except OSError:  # not empty: it holds something the earlier run did not write
            pass


def _inside(path: Path, top: Path) -> bool:
    """`path` is `top` or below it (resolved, so `..` and links cannot reach outside)."""
    try:
        resolved = path.resolve()
        root = top.resolve()
    except OSError:
        return False
    return resolved == root or root in resolved.parents


def _read_marker(out: Path) -> dict | None:
    path = out / MARKER
    if not path.exists():
        return None
    require_regular_file(path, "run marker", RunDirError)
    try:
        marker = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunDirError(
            f"{path} is unreadable ({e}); the directory's run cannot be told from your files: "
            "pass another --out"
        ) from None
    if not isinstance(marker, dict):
        raise RunDirError(f"{path} is not a run marker of this toolkit; pass another --out")
    return marker


def _some(names: list[str], shown: int = 4) -> str:
    more = f", and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more

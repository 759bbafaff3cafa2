"""A set of fork servers (preload/server.py), one per backend's imports, and the manifest that sends
a backend's processes to them (preload/client.py): what compare starts for its own run and the test
suite for its session.

Each server is started from `python` with the environment its children will have (a child whose
environment differs where a preloaded module reads it is declined and starts plain), in a folder of
the set's own, removed with it. Framework-free.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from preload.client import MANIFEST_ENV

POLL_S = 0.05
# a Unix socket's path holds at most 107 bytes; the server binds `<socket>.<pid>` first
SOCKET_FOLDER_ROOM = 80


@dataclass(frozen=True)
class ServerSpec:
    """One server: `name` (its files'), the interpreter, what it imports first, and the modules
    (`python -m ROUTE...`) it serves."""

    name: str
    python: str
    imports: tuple[str, ...]
    routes: tuple[str, ...]


class Servers:
    """Started servers: `manifest` is what MANIFEST_ENV names for their clients."""

    def __init__(self, specs: list[ServerSpec], env: dict, cwd: Path | None = None):
        self.folder = _short_folder()
        self.manifest = self.folder / "servers.json"
        self.sockets, self.procs = [], []
        entries = []
        try:
            for i, spec in enumerate(specs):
                socket_path = self.folder / f"{i}.sock"
                # what its imports leave there (torch's own temporary folder) goes with it
                own_tmp = self.folder / f"{spec.name}.tmp"
                own_tmp.mkdir()
                with open(self.folder / f"{spec.name}.err", "w") as err:
                    self.procs.append(
                        subprocess.Popen(
                            [
                                spec.python,
                                "-m",
                                "preload.server",
                                "--socket",
                                str(socket_path),
                                "--preload",
                                ",".join(spec.imports),
                            ],
                            cwd=cwd,
                            env={**env, "TMPDIR": str(own_tmp)},
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL,
                            stderr=err,
                            # a terminal's Ctrl-C is compare's to act on: it ends them
                            start_new_session=True,
                        )
                    )
                self.sockets.append(socket_path)
                entries.append(
                    {"socket": str(socket_path), "python": spec.python, "routes": list(spec.routes)}
                )
            self.manifest.write_text(json.dumps({"servers": entries}))
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout_s: float) -> None:
        """Until every server serves, one has ended, or `timeout_s` passed: a command started
        before its server serves starts plain, as it would without one."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ended = any(p.poll() is not None for p in self.procs)
            if ended or all(s.exists() for s in self.sockets):
                return
            time.sleep(POLL_S)

    def counts(self) -> dict:
        """{served, plain, why_plain}: the processes its clients started, from their log beside the
        manifest (preload/client.py)."""
        log = Path(f"{self.manifest}.log")
        lines = log.read_text().splitlines() if log.exists() else []
        plain = [ln for ln in lines if ln.startswith("plain")]
        return {
            "served": len(lines) - len(plain),
            "plain": len(plain),
            "why_plain": sorted({ln.split(": ", 1)[-1] for ln in plain}),
        }

    def stop(self) -> str:
        """The servers ended and their folder removed; returns what they served (one line)."""
        counts = self.counts()
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
        why = counts["why_plain"]
        return (
            f"preloaded interpreters served {counts['served']} processes, {counts['plain']} "
            "started plain" + (f" ({'; '.join(why)[:600]})" if why else "")
        )


def _short_folder() -> Path:
    """The set's folder, in the temporary directory where a socket's path fits there, else in
    /tmp (a long TMPDIR: a test's, a cluster's scratch path)."""
    folder = Path(tempfile.mkdtemp(prefix="xla-twins-preload-"))
    if len(os.fsencode(folder)) <= SOCKET_FOLDER_ROOM:
        return folder
    folder.rmdir()
    return Path(tempfile.mkdtemp(prefix="xla-twins-preload-", dir="/tmp"))


def serving() -> bool:
    """Whether this process's commands already go to servers (a session's, or a compare's), or to
    none by the user's word (MANIFEST_ENV "off"): either way a compare starts none of its own."""
    return MANIFEST_ENV in os.environ

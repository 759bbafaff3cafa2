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
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from preload.client import MANIFEST_ENV, interrupts_held

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

    def __init__(
        self, specs: list[ServerSpec], env: dict, cwd: Path | None = None, ready_s: float = 0.0
    ):
        """`ready_s`: how long a command for a server that does not serve yet waits for it (its
        imports) before it starts plain; 0: it starts plain at once."""
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
                # a Ctrl-C while it starts acts once it is in `procs`, for stop to end (one raised
                # inside Popen, after its fork, left a server nobody ended)
                with open(self.folder / f"{spec.name}.err", "w") as err, interrupts_held() as held:
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
                                "--parent",
                                str(os.getpid()),
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
                if held:
                    signal.raise_signal(held[0])
                self.sockets.append(socket_path)
                entries.append(
                    {
                        "socket": str(socket_path),
                        "python": spec.python,
                        "routes": list(spec.routes),
                        "pid": self.procs[-1].pid,
                        "ready_by": time.time() + ready_s if ready_s else 0,
                    }
                )
            self.manifest.write_text(json.dumps({"servers": entries}))
        except BaseException:
            self.stop()
            raise

    def counts(self) -> dict:
        """{served, plain, why_plain}: the processes its clients started, from their log beside the
        manifest (preload/client.py)."""
        log = Path(f"{self.manifest}.log")
        lines = log.read_text().splitlines() if log.exists() else []
        plain = [ln for ln in lines if ln.startswith("plain")]
        waits = [float(ln.rsplit(" ", 1)[-1]) for ln in lines if " waited " in ln]
        return {
            "served": len(lines) - len(plain),
            "plain": len(plain),
            "why_plain": sorted({ln.split(": ", 1)[-1] for ln in plain}),
            # how long processes waited for a server's imports before it served them
            "waited_s": round(sum(waits), 3),
        }

    def terminate(self) -> None:
        """Each server told to end (SIGTERM), not waited for: the kernel takes down a framework's
        address space in ~0.07 s (measured), which can overlap what its owner does next."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()

    def stop(self) -> dict:
        """The servers ended and their folder removed; returns what they served (`counts`, read
        before their log goes with the folder)."""
        counts = self.counts()
        self.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
        return counts


def served_line(counts: dict) -> str:
    """What a set of servers served (`Servers.counts()`), in one line."""
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

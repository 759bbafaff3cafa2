"""Backends die with compare, however compare dies (SIGKILL and the OOM killer included).

compare starts this guard once, as its own small process (no framework: a plain interpreter), and
keeps the write end of a pipe to its stdin. compare writes `watch PGID` when it starts a subprocess
group (a backend, a describe step) and `unwatch PGID` when that group is gone. The guard reads until
end of file: the kernel closes the pipe when compare exits for any reason, so EOF with groups still
watched means compare died without cleaning up. The guard then SIGTERMs every group it still
watches, SIGKILLs what is left after a grace period, and exits. A parent-death signal
(PR_SET_PDEATHSIG) would reach only the backend itself, not its children (data loaders, xmp.spawn
workers); a process group reaches them all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

GRACE_S = 3.0


# common.procs.group_alive's twin: this file runs alone (`python -I`)
def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _take_down(groups: set[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and any(_alive(g) for g in groups):
            time.sleep(0.05)


def serve(stream) -> None:
    """The guard's loop: track the watched groups until EOF, then take the remaining ones down."""
    groups: set[int] = set()
    for line in stream:
        verb, _, pgid = line.strip().partition(" ")
        if verb == "watch" and pgid.isdigit():
            groups.add(int(pgid))
        elif verb == "unwatch" and pgid.isdigit():
            groups.discard(int(pgid))
    _take_down({g for g in groups if _alive(g)})


class Guard:
    """compare's side: one guard process per compare process, started on first use."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None

    def _pipe(self):
        if self._proc is None or self._proc.poll() is not None:
            # its own session: a Ctrl-C sent to compare's terminal group must not take the guard
            # first (run as a script in isolated mode: it needs the standard library only)
            self._proc = subprocess.Popen(
                [sys.executable, "-I", __file__],
                stdin=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        return self._proc.stdin

    def _say(self, line: str) -> None:
        try:
            pipe = self._pipe()
            pipe.write(line + "\n")
            pipe.flush()
        # no guard (cannot start a process): the groups are still killed on every normal path
        except OSError:
            pass

    def watch(self, pgid: int) -> None:
        self._say(f"watch {pgid}")

    def unwatch(self, pgid: int) -> None:
        self._say(f"unwatch {pgid}")


GUARD = Guard()

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only EOF on the pipe ends the guard
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve(sys.stdin)

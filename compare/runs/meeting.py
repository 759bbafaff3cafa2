"""Where the hosts of a multi-host run meet before any backend starts (compare/runs/hosts.py).

Every host runs the same command. A host that refuses it (its --out taken by another, an input it
cannot read) used to leave the others' processes waiting for it at the coordinator until their wait
ran out, and host 0 then ended on XLA's fatal line, naming no host. Now host 0, once its run
directory is claimed, listens on the coordinator's address one port above the launches' (PORT +
LAUNCH_PORTS), and every other host says there, before its backends start, that it is ready (with
its layout: --num-hosts, --processes, --host-id) or why it refused. Host 0 answers each ready host
`go` once all are ready in its layout, or `stop` naming the host that refused, never came, was
started with another layout, or took another's number; that host's error line is the reason every
host gives. One line, exit 2, within the coordinator's wait (XLA_TWINS_COORDINATOR_WAIT_S, 300 s by
default, as the backends' own). The training settings are not compared here: the backends' processes
compare theirs (common/multiprocess.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time

from common.environment import coordinator_wait_s
from common.spec import SpecError
from common.vocab import ExitCode
from compare.options import Group
from compare.runs.hosts import LAUNCH_PORTS

TELL_S = 30.0  # how long a refusing host tries to tell host 0 before it exits anyway


class MeetingError(SpecError):
    """The hosts did not all come ready: one line naming the host and why."""


def _address(hosts: Group) -> tuple[str, int]:
    host, _, port = hosts.coordinator.rpartition(":")
    return host, int(port) + LAUNCH_PORTS


def meet(hosts: Group) -> None:
    """Returns once every host of the run is ready (nothing on one host); raises MeetingError
    otherwise."""
    if hosts.hosts == 1:
        return
    if hosts.host == 0:
        _gather(hosts)
        return
    answer = _say(
        hosts,
        {"host": hosts.host, "ready": True, "hosts": hosts.hosts, "processes": hosts.processes},
        coordinator_wait_s(),
        wait_for_answer=True,
    )
    if answer is None:
        raise MeetingError(
            f"host 0 did not answer at {_where(hosts)} within {coordinator_wait_s():g} s: "
            "host 0 not started (or stopped), another --coordinator, or a firewall between the "
            "hosts"
        )
    if not answer.get("go"):
        raise MeetingError(f"host 0 stopped this run: {answer.get('why')}")


def _where(hosts: Group) -> str:
    host, port = _address(hosts)
    return f"{host}:{port}"


def _gather(hosts: Group) -> None:
    """Host 0: every other host's word, then each ready one answered."""
    ready: list[tuple[int, socket.socket]] = []  # (host, its connection), in the order they came
    deadline = time.monotonic() + coordinator_wait_s()
    try:
        server = socket.create_server(("", _address(hosts)[1]))
    except OSError as e:
        why = os.strerror(e.errno) if e.errno else str(e)
        raise MeetingError(
            f"cannot meet the other hosts at {_where(hosts)} ({why}): another host 0 of "
            "this run (give each host its own --host-id), or another run on that port (give "
            "another "
            "--coordinator port)"
        ) from None
    with server:
        try:
            while len(ready) < hosts.hosts - 1:
                server.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    came = {h for h, _ in ready}
                    missing = [str(h) for h in range(1, hosts.hosts) if h not in came]
                    raise MeetingError(
                        f"host(s) {', '.join(missing)} of {hosts.hosts} did not come to "
                        f"{_where(hosts)} "
                        f"within {coordinator_wait_s():g} s: not started, another "
                        "--coordinator, or a firewall between the hosts"
                    ) from None
                word = _read(conn, 10.0)
                if word is None or not isinstance(word.get("host"), int):
                    conn.close()
                    continue
                if not word.get("ready"):
                    conn.close()
                    raise MeetingError(f"host {word['host']} refused this run: {word.get('why')}")
                came = {h for h, _ in ready}
                ready.append((word["host"], conn))  # answered below, whatever the answer
                _check_layout(word, hosts, came)
            _answer(ready, {"go": True})
        except MeetingError as e:
            _answer(ready, {"go": False, "why": str(e)})
            raise


def _check_layout(word: dict, hosts: Group, came: set[int]) -> None:
    """A ready host's layout is host 0's, and its number its own."""
    theirs = {"--num-hosts": word.get("hosts"), "--processes": word.get("processes")}
    ours = {"--num-hosts": hosts.hosts, "--processes": hosts.processes}
    other = [
        f"{flag} {theirs[flag]} (host 0: {ours[flag]})"
        for flag in ours
        if theirs[flag] != ours[flag]
    ]
    if other:
        raise MeetingError(
            f"host {word['host']} was started with {', '.join(other)}: run the same command on "
            "every "
            "host, each with its own --host-id"
        )
    if word["host"] in came or not 0 < word["host"] < hosts.hosts:
        raise MeetingError(
            f"two hosts say they are host {word['host']}: give each host its own --host-id, 0 to "
            f"{hosts.hosts - 1}"
        )


def _answer(ready: list, answer: dict) -> None:
    for _, conn in ready:
        with contextlib.suppress(OSError):
            conn.sendall((json.dumps(answer) + "\n").encode())
        conn.close()
    ready.clear()


def refused(hosts: Group, why: str) -> None:
    """A host other than 0 that refuses the run tells host 0 why (best effort, for TELL_S at
    most)."""
    if hosts.hosts == 1 or hosts.host == 0 or not hosts.coordinator:
        return
    _say(
        hosts,
        {"host": hosts.host, "ready": False, "why": why},
        min(coordinator_wait_s(), TELL_S),
        wait_for_answer=False,
    )


def _say(hosts: Group, word: dict, seconds: float, wait_for_answer: bool) -> dict | None:
    """Sends `word` to host 0, trying until it listens or `seconds` pass; its answer, when one is
    awaited."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection(_address(hosts), timeout=5) as conn:
                conn.sendall((json.dumps(word) + "\n").encode())
                return (
                    _read(conn, max(1.0, deadline - time.monotonic())) if wait_for_answer else None
                )
        except OSError:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.5)


def _read(conn: socket.socket, seconds: float) -> dict | None:
    """One JSON line from `conn` within `seconds`; None for nothing, or anything else."""
    conn.settimeout(seconds)
    data = b""
    with contextlib.suppress(OSError):
        while not data.endswith(b"\n") and len(data) < 65536:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
    try:
        word = json.loads(data)
    except ValueError:
        return None
    return word if isinstance(word, dict) else None


@contextlib.contextmanager
def refusals_told(hosts: Group):
    """Around a host's compare: a usage error it ends on (common/cli.py fail's line) is told to host
    0 first; not one of the meeting's own (host 0's answer, or host 0 not answering), which host 0
    knows or cannot hear (the host went on trying to tell it, up to TELL_S, after host 0 had
    stopped the run)."""
    try:
        yield
    except SystemExit as e:
        met = isinstance(e.__context__, MeetingError)  # fail() called on the meeting's error
        if e.code == ExitCode.USAGE and getattr(e, "error", None) and not met:
            refused(hosts, e.error)
        raise

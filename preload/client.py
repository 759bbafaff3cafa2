"""Starting a process through a preloading fork server where one serves it, else as a plain
subprocess.

XLA_TWINS_PRELOAD names a JSON manifest: {"servers": [{"socket": PATH, "python": INTERPRETER,
"routes": [MODULE, ...]}]}. A command `INTERPRETER -m MODULE ...` whose module is, or is inside, a
route of a server for that interpreter goes to that server; `-c CODE` goes to the server routing
"-c". Anything the server declines or cannot be reached for starts as a plain subprocess.Popen, so a
command behaves alike either way.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import threading
from contextlib import contextmanager

MANIFEST_ENV = "XLA_TWINS_PRELOAD"  # or "off" (common/environment.py): no server
OFF = "off"


# what ends a run (compare's handlers raise KeyboardInterrupt for each)
INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def interrupts_held():
    """Ctrl-C, SIGTERM and SIGHUP recorded, not acted on, inside the block (in the main thread,
    where Python runs signal handlers): the list yielded holds those that came. Signals ignored on
    entry stay ignored."""
    pending: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pending
        return
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: pending.append(signum))
        for sig in INTERRUPTS
        if signal.getsignal(sig) is not signal.SIG_IGN
    }
    try:
        yield pending
    finally:
        for sig, handler in previous.items():  # None: a handler set outside Python
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def start(
    command: list[str],
    *,
    stdin=None,
    stdout=None,
    stderr=None,
    env: dict | None = None,
    cwd=None,
    pass_fds: tuple[int, ...] = (),
    start_new_session: bool = False,
    text: bool = False,
    errors: str | None = None,
):
    """subprocess.Popen(command, ...) for these arguments, served by a preloaded interpreter where
    one is. Only a command in a session of its own is served: a server's child cannot join the
    caller's process group. Its arguments may be paths, as Popen's may."""
    command = [os.fspath(arg) for arg in command]
    server = _server_for(command) if start_new_session else None
    if server is not None:
        proc = _start_served(
            server,
            command,
            stdin,
            stdout,
            stderr,
            env,
            cwd,
            pass_fds,
            start_new_session,
            text,
            errors,
        )
        if proc is not None:
            return proc
    return subprocess.Popen(
        command,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        env=env,
        cwd=cwd,
        pass_fds=pass_fds,
        start_new_session=start_new_session,
        text=text,
        errors=errors,
    )


def start_ending_with_caller(command: list[str], *, stdin=None, stdout=None, stderr=None):
    """`command` served in a session of its own that ends with the caller, however the caller ends
    (the server kills the child's group when the caller's end of their connection closes: the
    caller, not the server, is the child's keeper), or None where no server serves it."""
    command = [os.fspath(arg) for arg in command]
    server = _server_for(command)
    if server is None:
        return None
    return _start_served(
        server,
        command,
        stdin,
        stdout,
        stderr,
        env=None,
        cwd=None,
        pass_fds=(),
        session=True,
        text=False,
        errors=None,
        ends=True,
    )


def run(
    command: list[str],
    *,
    env: dict | None = None,
    cwd=None,
    timeout: float | None = None,
    stdin=subprocess.DEVNULL,
) -> subprocess.CompletedProcess:
    """subprocess.run(command, capture_output=True, text=True, ...) through start(): output to
    unnamed files."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = start(
            command, stdin=stdin, stdout=out, stderr=err, env=env, cwd=cwd, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout)
        except BaseException:  # its timeout, or a Ctrl-C: the child is in a session of its own
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, proc.returncode, out.read(), err.read())


class ServedProcess:
    """The Popen calls compare makes (pid, poll, wait, signals, stdout) for a child of a fork
    server, whose exit status the server sends on the connection once it has reaped it."""

    def __init__(self, args, pid: int, conn: socket.socket, stdin, stdout, stderr, said=b""):
        self.args, self.pid, self.returncode = args, pid, None
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        # what the server said after `pid N` (its `exit CODE` when the child ended at once)
        self._conn, self._said = conn, said

    def poll(self):
        if self.returncode is None:
            self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None):
        if self.returncode is None:
            self._read(timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read(self, timeout: float | None) -> None:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._said:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._conn], [], [], left)[0]:
                return
            chunk = self._conn.recv(64)
            # the server died before it could tell: the child's status is lost with it
            if not chunk:
                self._said += b"exit 255\n"
            self._said += chunk
        word = self._said.split(b"\n", 1)[0].decode().split()
        # a line cut short (the server gone mid-line) is the lost status's 255
        self.returncode = int(word[1]) if len(word) == 2 and word[1].lstrip("-").isdigit() else 255
        self._conn.close()


def _manifest() -> list[dict]:
    path = os.environ.get(MANIFEST_ENV)
    if not path or path == OFF:
        return []
    try:
        with open(path) as f:
            return json.load(f)["servers"]
    except (OSError, ValueError, KeyError):
        return []


def _note(line: str) -> None:
    """One line per start in MANIFEST.log: what was served, what started plain and why (the suite's
    measure)."""
    try:
        with open(os.environ[MANIFEST_ENV] + ".log", "a") as f:
            f.write(line.replace("\n", " ") + "\n")
    except OSError:
        pass


# modules that run other modules (`python -m LAUNCHER [--FLAG...] MODULE ARGS...`): a command of one
# no server routes goes where the first module it runs would (a twin's side described, then its run
# made, by driver/describe_sides.py: that side's server)
LAUNCHERS = ("driver.describe_sides",)


def _server_for(command: list[str]) -> dict | None:
    if len(command) < 3 or command[1] not in ("-m", "-c"):
        return None
    route = command[2] if command[1] == "-m" else "-c"
    found = _routed(command[0], route)
    if found is None and route in LAUNCHERS:
        first = next((arg for arg in command[3:] if not arg.startswith("-")), None)
        found = first and _routed(command[0], first)
    return found


def _routed(python: str, route: str) -> dict | None:
    for server in _manifest():
        if os.path.abspath(server["python"]) != os.path.abspath(python):
            continue
        if any(route == r or route.startswith(r + ".") for r in server["routes"]):
            return server
    return None


def _wait_for(server: dict) -> float:
    """Until the server serves, where its manifest entry says to wait for it (`ready_by`: the epoch
    second after which a command starts plain instead; `pid`: the server, whose end stops the wait);
    returns the seconds waited."""
    import time

    started = time.monotonic()
    while not os.path.exists(server["socket"]) and time.time() < server.get("ready_by", 0):
        try:
            os.kill(server["pid"], 0)
        except (KeyError, OSError):
            break
        time.sleep(0.02)
    return time.monotonic() - started


def _start_served(
    server, command, stdin, stdout, stderr, env, cwd, pass_fds, session, text, errors, ends=False
):
    # descriptors made here for the child (closed once sent), ends kept for the parent
    opened, kept = [], {}
    waited = _wait_for(server)

    def child_end(spec, fd: int, reading: bool) -> int:
        if spec is None:
            return fd
        if spec == subprocess.DEVNULL:
            opened.append(os.open(os.devnull, os.O_RDWR))
            return opened[-1]
        if spec == subprocess.PIPE:
            read_end, write_end = os.pipe()
            opened.append(write_end if reading is False else read_end)
            kept[fd] = read_end if reading is False else write_end
            return opened[-1]
        return spec if isinstance(spec, int) else spec.fileno()

    try:
        fds = [child_end(stdin, 0, True), child_end(stdout, 1, False)]
        fds.append(fds[1] if stderr == subprocess.STDOUT else child_end(stderr, 2, False))
        fds += list(pass_fds)
        request = {
            "argv": command,
            "cwd": os.path.abspath(cwd or os.getcwd()),
            "env": dict(os.environ if env is None else env),
            "fds": [0, 1, 2, *pass_fds],
            "session": session,
            "ends_with_client": ends,
        }
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(10)
            conn.connect(server["socket"])
            socket.send_fds(conn, [b"\0"], fds)
            body = json.dumps(request).encode()
            conn.sendall(len(body).to_bytes(4, "big") + body)
            answer = b""
            while b"\n" not in answer:
                chunk = conn.recv(256)
                if not chunk:
                    raise OSError("the server closed the connection")
                answer += chunk
        except OSError:
            conn.close()
            raise
        # a child that ends at once has its `exit CODE` line in the same read: kept for wait()
        first, _, after = answer.partition(b"\n")
        word, _, rest = first.decode().strip().partition(" ")
        if word != "pid":
            conn.close()
            raise OSError(rest)
    except OSError as e:
        _note(f"plain {command[2] if command[1] == '-m' else '-c'}: {e}")
        for fd in kept.values():
            os.close(fd)
        return None
    finally:
        for fd in opened:
            os.close(fd)
    conn.settimeout(None)
    route = command[2] if command[1] == "-m" else "-c"
    _note(f"served {route}" + (f" waited {waited:.3f}" if waited >= 0.001 else ""))
    ends = {
        fd: open(end, "r" if fd else "w", errors=errors)
        if text
        else open(end, "rb" if fd else "wb")
        for fd, end in kept.items()
    }
    return ServedProcess(command, int(rest), conn, ends.get(0), ends.get(1), ends.get(2), after)

"""The fork server: `python -m preload.server --socket PATH --preload jax,flax.nnx,...`.

It imports the named modules (never a device: no array is made, no backend initialised, so forking
stays safe), then serves one request per connection on a Unix socket: the command (`python -m MODULE
ARGS` or `python -c CODE ARGS`, for this very interpreter), its working directory, environment and
file descriptors (sent with SCM_RIGHTS). It forks; the child becomes that process (its own session
where asked, the descriptors at their numbers, the environment, path, argv and stdio a fresh
interpreter would have) and runs the command as `__main__`, so it ends as that interpreter would
(exit code, traceback, atexit). The server answers `pid N`, then `exit CODE` once it has reaped the
child (a negative CODE: killed by that signal), or `decline WHY` for a request a fresh interpreter
would run differently (another interpreter, or an environment variable the preloaded modules read at
import differs): the client then starts a plain process. A child asked to end with its client
(`ends_with_client`) is killed with its group should the client's end of the connection close
first: the client, not this server, keeps it.
"""

from __future__ import annotations

import argparse
import builtins
import importlib
import json
import os
import random
import runpy
import selectors
import signal
import socket
import sys
import tempfile
import types

# Variables a child's environment may set otherwise than the server's: none is read by a preloaded
# module at import (jax reads XLA_FLAGS when its backend starts, torch_xla its own, XLA_FLAGS and
# the CPU device count when its runtime starts; the TPU ones are for libtpu when a device starts);
# PYTHONPATH, PYTHONUNBUFFERED and PYTHONDONTWRITEBYTECODE are applied to the child as its
# interpreter would.
MAY_DIFFER = frozenset(
    {
        "PYTHONPATH",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "TMPDIR",
        "XDG_CACHE_HOME",
        "XLA_FLAGS",
        "CPU_NUM_DEVICES",
        "PJRT_DEVICE",
        "PJRT_CPU_ASYNC_CLIENT",
        "COLUMNS",
        "LINES",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "TPU_SKIP_MDS_QUERY",
        "ENABLE_RUNTIME_UPTIME_TELEMETRY",
    }
)
MAY_DIFFER_PREFIXES = ("XLA_TWINS_", "PYTEST_")
BASE_ENV = dict(os.environ)  # what the preloaded modules saw
# a preloaded module so marked (`?jaxlib.mlir.dialects.mhlo`) is imported where this interpreter has
# it: a framework's internal module that another release of it (a side's own interpreter) may not
OPTIONAL = "?"


def main(argv: list[str] | None = None) -> Child:
    parser = argparse.ArgumentParser(
        prog="python -m preload.server", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--socket", required=True, help="the Unix socket to serve on (made atomically)"
    )
    parser.add_argument(
        "--preload",
        default="",
        help="comma-separated modules to import first (?NAME: where this interpreter has it)",
    )
    parser.add_argument(
        "--parent",
        type=int,
        default=None,
        help="the pid of the process that starts it (it ends at once if that one is gone already)",
    )
    args = parser.parse_args(argv)
    # before the imports, which take seconds: a parent that ends while they run takes the server too
    parent = _die_with_parent(args.parent)
    for name in filter(None, args.preload.split(",")):
        try:
            importlib.import_module(name.removeprefix(OPTIONAL))
        except ImportError:
            if not name.startswith(OPTIONAL):
                raise
    return serve(args.socket, parent)


def serve(path: str, parent: int | None = None) -> Child:
    """Serves until the parent (`parent`, by default this process's now) is gone; returns only in a
    forked child, the process it is to become."""
    parent = os.getppid() if parent is None else parent
    if os.getppid() != parent:  # it ended before the server could serve
        sys.exit(0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = f"{path}.{os.getpid()}"
    listener.bind(staging)
    listener.listen(64)
    os.replace(staging, path)  # a client sees the socket only once it accepts
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        for key, _ in selector.select(timeout=1.0):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                child = _answer(conn, children, selector, [listener, wake_read, wake_write])
                if child is not None:  # in the forked child from here on
                    return child
            elif key.fileobj is wake_read:
                _drain(wake_read)
            else:
                _client_gone(key, selector)
        _reap(children, selector)
    sys.exit(0)


def _answer(
    conn: socket.socket, children: dict[int, socket.socket], selector, own: list
) -> Child | None:
    """Reads one request and forks its child (returned in the child); `own`: what the server holds
    open besides the selector, closed in the child before its descriptors are placed. A child asked
    to end with its client (`ends_with_client`: a process whose starter is its only keeper,
    compare/runs/processes.py) has its connection watched: when the client is gone, however it
    ended, the child's group is killed."""
    conn.settimeout(10)
    fds: list[int] = []
    try:
        _, fds, _, _ = socket.recv_fds(conn, 1, 64)
        request = json.loads(_exactly(conn, int.from_bytes(_exactly(conn, 4), "big")))
        why = declined(request)
        if why:
            conn.sendall(f"decline {why}\n".encode())
            raise OSError(why)
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for held in [selector, *own, *children.values(), conn]:
            os.close(held) if isinstance(held, int) else held.close()
        return Child(request, fds)
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(f"pid {pid}\n".encode())
    except OSError:
        pass  # the client is gone; the child still runs and is reaped
    children[pid] = conn
    if request.get("ends_with_client"):
        conn.setblocking(False)
        selector.register(conn, selectors.EVENT_READ, (pid, bool(request.get("session"))))
    return None


def _client_gone(key, selector) -> None:
    """A watched child's connection is readable: the client sends nothing after its request, so it
    is gone (its end closed: it exited or was killed) and the child, its only keeper gone, is killed
    with its group (its own session's) or alone."""
    try:
        if key.fileobj.recv(64):
            return
    except BlockingIOError:
        return
    except OSError:
        pass
    selector.unregister(key.fileobj)
    pid, session = key.data
    try:
        os.killpg(pid, signal.SIGKILL) if session else os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def declined(request: dict) -> str:
    """Why a fresh interpreter would run `request` otherwise than a child of this server ('' when it
    would not)."""
    argv = request["argv"]
    if os.path.abspath(argv[0]) != os.path.abspath(sys.executable):
        return f"another interpreter ({argv[0]})"
    if len(argv) < 3 or argv[1] not in ("-m", "-c"):
        return "not python -m MODULE or -c CODE"
    env = request["env"]
    differ = sorted(
        k
        for k in set(env) | set(BASE_ENV)
        if env.get(k) != BASE_ENV.get(k)
        and k not in MAY_DIFFER
        and not k.startswith(MAY_DIFFER_PREFIXES)
    )
    return f"environment differs: {','.join(differ)}" if differ else ""


def _exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise OSError("the client closed the connection")
        data += chunk
    return data


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _reap(children: dict[int, socket.socket], selector) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        try:
            selector.unregister(conn)  # a child that was to end with its client
        except KeyError:
            pass
        try:
            conn.setblocking(True)
            conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
        except OSError:
            pass
        conn.close()


def _die_with_parent(expected: int | None) -> int:
    """SIGTERM when the process that started the server ends (Linux), however it ends; returns that
    process's pid. `expected`: its pid as it said; one that ended before the signal was armed (the
    interpreter's start takes a while) left this server to another parent, and it ends now (it
    would have served that one forever)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    parent = os.getppid()  # read after the signal is armed: no ending slips between the two
    if expected is not None and parent != expected:
        sys.exit(0)
    return parent


class Child:
    """A forked child becoming the requested process."""

    def __init__(self, request: dict, fds: list[int]):
        self.argv = request["argv"]
        if request.get("session"):
            os.setsid()
        _place(fds, request["fds"])
        os.chdir(request["cwd"])
        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        _import_time_environment()
        _set_path(env.get("PYTHONPATH", ""), os.getcwd() if self.argv[1] == "-m" else "")
        _set_stdio(bool(env.get("PYTHONUNBUFFERED")))
        sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
        tempfile.tempdir = None
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()

    def run(self) -> None:
        mode, target, *args = self.argv[1:]
        if mode == "-m":
            sys.argv = [target, *args]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
            return
        sys.argv = ["-c", *args]
        module = types.ModuleType("__main__")
        module.__builtins__ = builtins
        sys.modules["__main__"] = module
        exec(compile(target, "<string>", "exec"), module.__dict__)


def _import_time_environment() -> None:
    """What a preloaded module's import does to the environment, done again on the child's own, as
    its fresh import would have done it: torch_xla's defaults (TF_CPP_MIN_LOG_LEVEL,
    GRPC_VERBOSITY), its XLA flags (--xla_cpu_enable_fast_math=false, added to the child's
    XLA_FLAGS) and its dynamic plugins."""
    torch_xla = sys.modules.get("torch_xla")
    if torch_xla is not None:
        torch_xla._setup_default_env()  # noqa: SLF001  (torch_xla's own, run at its import)
        torch_xla._setup_xla_flags()  # noqa: SLF001
        # torch_xla.experimental.plugins, at import
        if os.getenv("XLA_REGISTER_INSTALLED_PLUGINS", "1") == "1":
            os.environ["PJRT_DYNAMIC_PLUGINS"] = "1"


def _place(fds: list[int], targets: list[int]) -> None:
    """The received descriptors at the numbers the command was given them (0, 1, 2 and its
    pass_fds)."""
    high = [os.dup(fd) if fd >= 100 else _dup_high(fd) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, target in zip(high, targets):
        os.dup2(fd, target)  # inheritable, as the command's own descriptors are
    keep = {0, 1, 2, *targets}
    # as Popen's close_fds: nothing else inherited
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor


def _dup_high(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100)


def _set_path(pythonpath: str, first: str) -> None:
    """sys.path as the child's interpreter makes it: its first entry, its PYTHONPATH, then the
    site's."""
    ours = [p for p in BASE_ENV.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = sys.path[1:]
    for entry in ours:
        if entry in rest:
            rest.remove(entry)
    sys.path[:] = [first, *[p for p in pythonpath.split(os.pathsep) if p], *rest]


def _set_stdio(unbuffered: bool) -> None:
    """New stdin/stdout/stderr objects on descriptors 0-2, buffered as a fresh interpreter would
    buffer them."""
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        old = getattr(sys, name)
        raw = os.fdopen(
            fd, mode + "b", buffering=0 if unbuffered and mode == "w" else -1, closefd=False
        )
        tty = os.isatty(fd)
        new = type(old)(
            raw,
            encoding=old.encoding,
            errors=old.errors,
            write_through=unbuffered and mode == "w",
            line_buffering=tty or name == "stderr",
        )
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)


if __name__ == "__main__":
    main().run()

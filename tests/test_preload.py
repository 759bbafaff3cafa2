"""preload/: a command a fork server runs behaves as the plain process would (output, exit code,
argv, working directory, environment, descriptors, process group), and what a fresh interpreter
would run otherwise starts plain, with the reason logged."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from preload import client
from tests.helpers import REPO

PYTHON = sys.executable
MISSING = "no_module_of_xla_twins"


def test_a_server_whose_module_is_missing_ends_unless_that_module_is_optional(tmp_path):
    """A module a framework's release may not have is marked optional (common/backends.py: jaxlib's
    MLIR dialects); any other that cannot be imported ends the server, whose commands then start
    plain."""
    proc = subprocess.run(
        [PYTHON, "-m", "preload.server", "--socket", str(tmp_path / "s"), "--preload", MISSING],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and f"No module named '{MISSING}'" in proc.stderr
    assert not (tmp_path / "s").exists()


def test_a_server_whose_starter_ended_before_it_armed_its_death_signal_ends_at_once(tmp_path):
    """The starter's pid on the command line (preload/servers.py passes it): a starter gone before
    the server armed its parent-death signal (here: the pid is not its parent) leaves the server to
    another parent, and it ends before its imports instead of serving that one forever."""
    proc = subprocess.run(
        [PYTHON, "-m", "preload.server", "--socket", str(tmp_path / "s"), "--preload", MISSING]
        + ["--parent", str(os.getpid() + 1_000_000)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    # ended before it imported (the missing module would have failed it) and before it bound
    assert (proc.returncode, proc.stderr) == (0, "") and not (tmp_path / "s").exists()


def test_an_interrupt_while_a_server_starts_leaves_no_server(monkeypatch):
    """A Ctrl-C that comes inside Popen, just after the server's fork, acts once the server is
    held in `procs`: the set's stop ends it (was: the KeyboardInterrupt left it running, nobody's).
    """
    from preload import servers as servers_module

    started = []
    popen = subprocess.Popen

    def interrupted_popen(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        signal.raise_signal(signal.SIGINT)  # the Ctrl-C, as the fork returns
        return started[-1]

    monkeypatch.setattr(servers_module.subprocess, "Popen", interrupted_popen)
    own = signal.signal(signal.SIGINT, signal.default_int_handler)  # compare's (a worker's may not)
    try:
        with pytest.raises(KeyboardInterrupt):
            servers_module.Servers(
                [servers_module.ServerSpec("json", PYTHON, ("json",), ("json.tool",))],
                {**os.environ, "PYTHONPATH": str(REPO)},
                cwd=REPO,
            )
    finally:
        signal.signal(signal.SIGINT, own)
    assert len(started) == 1 and started[0].poll() is not None


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A server preloading json only (no framework: this runs in `make test-fast`), routing -c and
    json.tool; and a module marked optional that no interpreter has (it serves without it)."""
    sock = tmp_path / "s.sock"
    preload = f"json,?{MISSING}"
    proc = subprocess.Popen(
        [PYTHON, "-m", "preload.server", "--socket", str(sock), "--preload", preload],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    manifest = tmp_path / "servers.json"
    manifest.write_text(
        json.dumps(
            {"servers": [{"socket": str(sock), "python": PYTHON, "routes": ["-c", "json.tool"]}]}
        )
    )
    monkeypatch.setenv(client.MANIFEST_ENV, str(manifest))
    # as the server's: nothing differs but what a test sets
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    deadline = time.monotonic() + 30
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield tmp_path
    proc.terminate()
    proc.wait(timeout=10)


def started(folder) -> list[str]:
    return (folder / "servers.json.log").read_text().splitlines()


def test_a_served_command_runs_as_the_plain_process_would(server, tmp_path):
    read_end, write_end = os.pipe()
    os.write(write_end, b"through a descriptor")
    os.close(write_end)
    code = (
        "import os, sys\nprint(sys.argv, os.getcwd(), os.environ['XLA_TWINS_MINE'], sys.path[:3])\n"
        "print(os.read(int(sys.argv[1]), 100).decode(), os.getpgrp() == os.getpid(), "
        "file=sys.stderr)\n"
        "print(sorted(int(f) for f in os.listdir('/proc/self/fd')))\nsys.exit(7)"
    )
    with open(tmp_path / "out", "w+") as out, open(tmp_path / "err", "w+") as err:
        proc = client.start(
            [PYTHON, "-c", code, str(read_end), "b"],
            stdout=out,
            stderr=err,
            cwd=tmp_path,
            env={**os.environ, "XLA_TWINS_MINE": "value", "PYTHONPATH": "/first:/second"},
            pass_fds=(read_end,),
            start_new_session=True,
        )
        os.close(read_end)
        assert isinstance(proc, client.ServedProcess)
        assert proc.wait(timeout=30) == 7
        out.seek(0)
        err.seek(0)
        argv_line, fds_line = out.read().splitlines()
        assert argv_line == f"['-c', '{read_end}', 'b'] {tmp_path} value ['', '/first', '/second']"
        # nothing the server held: the command's, and the listing's own
        fds = set(json.loads(fds_line))
        assert {0, 1, 2, read_end} <= fds and len(fds) == 5
        assert err.read() == "through a descriptor True\n"
    assert started(server) == ["served -c"]


def test_a_served_command_takes_paths_as_popen_does(server, tmp_path):
    with open(tmp_path / "out", "w+") as out:
        proc = client.start(
            [PYTHON, "-c", "import sys; print(sys.argv[1:])", tmp_path / "a path"],
            stdout=out,
            start_new_session=True,
        )
        assert isinstance(proc, client.ServedProcess) and proc.wait(timeout=30) == 0
        out.seek(0)
        assert out.read() == f"[{str(tmp_path / 'a path')!r}]\n"


def test_a_module_runs_as_main_and_a_traceback_exits_1(server):
    done = client.run([PYTHON, "-m", "json.tool", str(server / "servers.json")], cwd=REPO)
    assert done.returncode == 0 and json.loads(done.stdout)["servers"][0]["routes"] == [
        "-c",
        "json.tool",
    ]
    failed = client.run([PYTHON, "-c", "raise ValueError('from the child')"])
    assert failed.returncode == 1
    assert failed.stderr.splitlines()[-1] == "ValueError: from the child"
    assert started(server) == ["served json.tool", "served -c"]


def test_a_served_process_is_waited_on_signalled_and_killed_with_its_group(server):
    proc = client.start(
        [PYTHON, "-c", "import time; print('up', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert isinstance(proc, client.ServedProcess) and proc.stdout.readline() == "up\n"
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    assert proc.poll() is None and os.getpgid(proc.pid) == proc.pid
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def test_a_process_served_to_end_with_its_caller_ends_with_its_group_when_the_caller_is_killed(
    server,
):
    """compare/runs/processes.py's backend processes: served in sessions of their own, which a kill
    of the launcher's group does not reach, they end with their launcher however it ends (the
    server kills the child's group when the launcher's end of their connection closes: here a
    SIGKILL); a served process's own group, the grandchild it started, goes with it."""
    import psutil

    child = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('up', flush=True)\ntime.sleep(600)"
    )
    caller = subprocess.Popen(
        [
            PYTHON,
            "-c",
            "import subprocess, sys, time\nfrom preload import client\n"
            f"proc = client.start_ending_with_caller([sys.executable, '-c', {child!r}], "
            "stdout=subprocess.PIPE)\n"
            "proc.stdout.readline()\n"
            "print(type(proc).__name__, proc.pid, flush=True)\ntime.sleep(600)",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    kind, pid = caller.stdout.readline().split()
    group = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == int(pid)]
    assert kind == "ServedProcess" and len(group) == 2  # the served child and its grandchild
    caller.kill()
    caller.wait(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_running(p) for p in group):
        time.sleep(0.1)
    assert not any(_running(p) for p in group)
    assert started(server) == ["served -c"]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _running(proc) -> bool:
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_what_a_fresh_interpreter_would_run_otherwise_starts_plain_and_says_why(server, tmp_path):
    other = client.run(
        [PYTHON, "-c", "import os; print(os.environ['JAX_PLATFORMS'])"],
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert other.returncode == 0 and other.stdout == "cpu\n"
    # in the caller's group: a server's child cannot be
    grouped = client.start([PYTHON, "-c", "pass"])
    assert isinstance(grouped, subprocess.Popen) and grouped.wait(timeout=30) == 0
    # json.tool's package, not routed
    unrouted = client.run([PYTHON, "-m", "json"], stdin=subprocess.DEVNULL)
    assert unrouted.returncode != 0 and "No module named json.__main__" in unrouted.stderr
    assert started(server) == ["plain -c: environment differs: JAX_PLATFORMS"]


def test_a_session_whose_processes_mostly_started_plain_fails_and_says_why():
    from tests import preloaded

    # stop 72's whole suite: the tests that set HOME or JAX_PLATFORMS on purpose, ~1 %
    why = ["environment differs: HOME", "environment differs: JAX_PLATFORMS"]
    assert preloaded.unserved({"served": 1517, "plain": 14, "why_plain": why}) is None
    # a few such tests run alone
    assert preloaded.unserved({"served": 0, "plain": 6, "why_plain": why}) is None
    # servers whose environment differs from every test's
    error = preloaded.unserved(
        {"served": 12, "plain": 1519, "why_plain": ["environment differs: TF_CPP_MIN_LOG_LEVEL"]}
    )
    assert error.startswith("error: 1519 of the 1531 processes")
    assert "(environment differs: TF_CPP_MIN_LOG_LEVEL)" in error


@pytest.mark.slow
def test_torch_xla_served_after_its_preloaded_import_runs_as_a_fresh_interpreter(tmp_path):
    """The suite's torch_xla server imports torch_xla before torch_xla_impl sets the environment it
    reads (debug level, XLA's dump folder and flags, CPU devices): a served run equals a plain one,
    losses bit for bit, compiles, XLA flags (torch_xla's own --xla_cpu_enable_fast_math=false
    included), its HLO read from the dump."""
    from common.files.record import read_record
    from tests.helpers import process_env

    servers = json.loads(open(os.environ[client.MANIFEST_ENV]).read())["servers"]
    sock = next(s["socket"] for s in servers if "torch_xla_impl" in s["routes"])
    deadline = time.monotonic() + 300  # the session's servers import while the first tests run
    while not os.path.exists(sock) and time.monotonic() < deadline:
        time.sleep(0.5)
    records = {}
    for how, start in (("served", client.start), ("plain", subprocess.Popen)):
        command = [
            PYTHON,
            "-m",
            "torch_xla_impl",
            "--spec",
            "gpt-tiny",
            "--steps",
            "3",
            "--throughput-steps",
            "0",
            "--out",
            str(tmp_path / how),
        ]
        with open(tmp_path / f"{how}.err", "w") as err:
            proc = start(
                command,
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=REPO,
                env=process_env(),
                start_new_session=True,
            )
            assert isinstance(proc, client.ServedProcess) == (how == "served")
            assert proc.wait(timeout=600) == 0, (tmp_path / f"{how}.err").read_text()[-3000:]
        records[how] = read_record(tmp_path / how)
    served, plain = records["served"], records["plain"]
    assert served.losses == plain.losses
    assert [(e.phase, e.step) for e in served.compile_events] == [
        (e.phase, e.step) for e in plain.compile_events
    ]
    no_dump = [
        {k: re.sub(r" ?--xla_dump_to=\S+", "", v) for k, v in r.numerics["env"].items()}
        for r in records.values()
    ]
    assert (
        no_dump[0] == no_dump[1] and "--xla_cpu_enable_fast_math=false" in no_dump[0]["XLA_FLAGS"]
    ), no_dump
    assert served.hlo_stats and served.hlo_stats["op_histogram"] == plain.hlo_stats["op_histogram"]


def test_a_child_that_ends_before_its_pid_is_read_gives_its_exit_code(tmp_path, monkeypatch):
    """The server's two lines in one read (`pid N` and `exit CODE`: the child ended at once): the
    pid is N and the exit code the second line's, as a plain process's (was: the pid read as
    'N\\nexit 0', an internal error ending the run)."""
    import socket
    import threading

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "s.sock"))
    listener.listen(1)

    def answer_both_lines_at_once():
        conn, _ = listener.accept()
        socket.recv_fds(conn, 1, 8)
        size = int.from_bytes(conn.recv(4), "big")
        while size > 0:
            size -= len(conn.recv(size))
        conn.sendall(b"pid 4242\nexit 3\n")
        conn.close()

    thread = threading.Thread(target=answer_both_lines_at_once)
    thread.start()
    manifest = tmp_path / "servers.json"
    routes = {"socket": str(tmp_path / "s.sock"), "python": PYTHON, "routes": ["-c"]}
    manifest.write_text(json.dumps({"servers": [routes]}))
    monkeypatch.setenv(client.MANIFEST_ENV, str(manifest))
    proc = client.start([PYTHON, "-c", "pass"], start_new_session=True)
    thread.join(timeout=30)
    listener.close()
    assert isinstance(proc, client.ServedProcess)
    assert (proc.pid, proc.poll(), proc.wait(timeout=1)) == (4242, 3, 3)

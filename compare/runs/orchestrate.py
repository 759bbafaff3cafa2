"""Run one backend as a subprocess: its own interpreter, process group, logs and time limit.

`compare` never imports a framework: on a TPU VM only one process may own the
chips, and jax[tpu] and torch_xla[tpu] pin different libtpu releases, so each
backend may live in its own virtual environment (`--jax-python`,
`--torch-xla-python`).
"""

from __future__ import annotations

import itertools
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import backends
from common.files.fsutil import write_json_atomic
from common.files.record import LOG_FILES, PROCESS_LOGS, SPEC_FILE
from common.ops import OPS_DIR, read_ops, refusal
from common.procs import kill_group, start_group, toolkit_env
from common.protocol import outcome, run_request
from common.vocab import BackendStatus
from compare.runs.backend_output import BackendOutput
from compare.runs.guard import GUARD
from compare.runs.launch import Launch

STDOUT_LOG, STDERR_LOG = LOG_FILES
GRACE_S = 5.0  # a backend's group gets SIGTERM, then SIGKILL after this long


@dataclass
class BackendRun:
    name: str
    run_dir: Path
    status: BackendStatus
    exit_code: int | None
    message: str
    wall_s: float
    command: list[str]
    # epoch seconds at launch: the backend's timeline is placed against it
    started_at: float | None = None
    # a run its describe step's process made (compare/runs/prepare.py): epoch seconds that process
    # was launched
    described_at: float | None = None


def backend_env() -> dict[str, str]:
    """A backend's environment: this toolkit importable, output unbuffered."""
    env = toolkit_env()
    env["PYTHONUNBUFFERED"] = "1"
    return env


# the multi-host launches of this compare, in the order every host makes them
_LAUNCHES = itertools.count()


def coordinator_of(group) -> str:
    """host:port of a multi-process launch's coordinator: on one host a port free on 127.0.0.1 now;
    across hosts the given --coordinator's port plus the launch's number (every host makes the same
    launches in the same order, so each agrees on every port, and a port is never asked to serve two
    runs)."""
    if group.coordinator is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return f"127.0.0.1:{s.getsockname()[1]}"
    host, _, port = group.coordinator.rpartition(":")
    return f"{host}:{int(port) + next(_LAUNCHES)}"


def _handed(waiting, command: list[str], stderr_log: Path):
    """The described process `waiting` (compare/runs/prepare.py) handed the run `command` (`python
    -m PACKAGE ARGS`), its stderr into `stderr_log`; None when it is gone (it is stopped: the run
    starts as a new process)."""
    try:
        if waiting.proc.poll() is None:
            stderr_log.write_text("")  # there even should the process die before it opens it
            waiting.proc.stdin.write(run_request(command[2], command[3:], str(stderr_log)))
            waiting.proc.stdin.close()
            # what it said while describing: it was described, so nothing of the run's
            waiting.stderr.close()
            return waiting.proc
    except OSError:
        pass
    waiting.stop()
    return None


def _start(command: list[str], stderr_log: Path, env: dict):
    with open(stderr_log, "w") as err_log:
        # undecodable bytes replaced: a reader that stopped on one would leave the backend blocked
        # on the pipe; watched before a signal can act (should compare be killed, the guard takes
        # the group down)
        return start_group(
            command,
            stdout=subprocess.PIPE,
            stderr=err_log,
            text=True,
            errors="replace",
            env=env,
            on_start=GUARD.watch,
        )


def run_backend(
    name: str,
    python: str,
    launch: Launch,
    run_dir: Path,
    timeout_s: float,
    on_progress=None,
    waiting=None,
) -> BackendRun:
    """Run `name` with `launch` into `run_dir`: its spec written there first (the backend's one spec
    input); by the described process `waiting` where one waits to make it (compare/runs/prepare.py),
    else a new process."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / SPEC_FILE, launch.spec.to_dict())
    command = [
        python,
        "-m",
        backends.info(name).package,
        "--spec",
        str(run_dir / SPEC_FILE),
        *launch.flags,
        "--out",
        str(run_dir),
        "--progress",
    ]
    group = launch.group
    # cooperating processes, started and watched by compare/runs/processes.py in this group
    if group.total > 1:
        (run_dir / PROCESS_LOGS).mkdir(exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "compare.runs.processes",
            "--processes",
            str(group.processes),
            "--first-id",
            str(group.host * group.processes),
            "--total",
            str(group.total),
            "--coordinator",
            coordinator_of(group),
            "--logs",
            str(run_dir / PROCESS_LOGS),
            "--",
            *command,
        ]
    start, started_at = time.perf_counter(), time.time()
    with open(run_dir / STDOUT_LOG, "w") as out_log:
        output, proc = None, None
        # never bound to one (compare/runs/launch.py describing_runs)
        if waiting and group.total > 1:
            waiting.stop()
        elif waiting:
            output = waiting.output
            output.attach(out_log, on_progress)  # before the run is handed: no line of it is lost
            proc = _handed(waiting, command, run_dir / STDERR_LOG)
        described_at = waiting.started_at if proc is not None else None
        if proc is None:
            try:
                proc = _start(command, run_dir / STDERR_LOG, backend_env())
            except OSError as e:
                return BackendRun(
                    name,
                    run_dir,
                    BackendStatus.USAGE_ERROR,
                    None,
                    f"cannot start {python}: {e.strerror or e}; check "
                    f"--{name.replace('_', '-')}-python",
                    0.0,
                    command,
                )
            output = None
        try:  # from here on a signal in compare takes the group down, whenever it comes
            # attached from its first line: a backend writes as soon as it starts
            if output is None:
                output = BackendOutput(proc.stdout, out_log, on_progress)
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc, GRACE_S)
            GUARD.unwatch(proc.pid)
            output.join(timeout=5)
            return BackendRun(
                name,
                run_dir,
                BackendStatus.TIMEOUT,
                None,
                f"no result after --timeout {timeout_s:g} s; killed with its process group",
                time.perf_counter() - start,
                command,
                started_at,
            )
        except BaseException:  # Ctrl-C / SIGTERM in compare: take the backend down with us
            kill_group(proc, GRACE_S)
            GUARD.unwatch(proc.pid)
            raise
        wall = time.perf_counter() - start
        # children left behind by a backend that exited, and its TMPDIR
        kill_group(proc, grace_s=2.0)
        GUARD.unwatch(proc.pid)
        output.join(timeout=5)
    status, message = outcome(code, (run_dir / STDERR_LOG).read_text(errors="replace"))
    return BackendRun(name, run_dir, status, code, message, wall, command, started_at, described_at)


@dataclass
class Plan:
    """What compare runs: per backend its interpreter and launch (compare/runs/launch.py), or an
    existing run directory to reuse."""

    names: list[str]
    pythons: dict[str, str]
    launches: dict[str, Launch]
    reuse: dict[str, Path]
    out: Path
    timeout_s: float
    repeat: bool  # --check-determinism: run each backend twice
    # run first, into <out>/ops/<name> (common/ops.py)
    op_checks: dict[str, Launch] = field(default_factory=dict)
    # {name: the described process that makes its run} (prepare.py)
    waiting: dict = field(default_factory=dict)


@dataclass
class Outcome:
    runs: dict[str, BackendRun]
    repeats: dict[str, BackendRun]
    interrupted: bool
    # (what, run) of each extra run (a noise floor's) that failed: the verdict says so
    # (compare/runs/extra_runs.py extra_runs_check)
    extra_failed: list = field(default_factory=list)
    # {backend: why} of each step-0 capture run that failed: its pair says so where its location
    # would be (compare/runs/extra_runs.py mark_failed_captures)
    capture_failed: dict = field(default_factory=dict)


def check_ops(
    name: str, python: str, launch: Launch, folder: Path, timeout_s: float
) -> BackendRun | None:
    """A runtime's op check (common/ops.py): its one traced step under its op watch; its run refused
    (`cannot_run`, one line naming the op) when that step met an op it cannot lower or a CPU
    fallback that fails, else None (and None when the check could not be made: the run itself then
    shows why)."""
    run = run_backend(name, python, launch, folder, timeout_s)
    try:
        why = refusal(read_ops(folder))
    except KeyError:  # no file, or not one an op check wrote
        return None
    return (
        BackendRun(
            name,
            folder,
            BackendStatus.CANNOT_RUN,
            run.exit_code,
            why,
            run.wall_s,
            run.command,
            run.started_at,
        )
        if why
        else None
    )


def run_all(plan: Plan, live) -> Outcome:
    """Run the backends one after the other (never together: they would share the chips and the
    cores).

    Ctrl-C or SIGTERM (raised as KeyboardInterrupt) stops the loop; `run_backend` has already taken
    the running backend's process group down, and later backends are left `not_run`. A described
    process that waits for a run (plan.waiting) makes it; one left without (its backend refused, an
    interrupt) is stopped.
    """
    runs: dict[str, BackendRun] = {}
    repeats: dict[str, BackendRun] = {}
    current = None
    try:
        for name, launch in plan.op_checks.items():  # before any backend trains
            current = name
            refused = check_ops(
                name, plan.pythons[name], launch, plan.out / OPS_DIR / name, plan.timeout_s
            )
            if refused:
                runs[name] = refused
        for name in plan.names:
            if name in runs:  # refused by its op check
                continue
            if name in plan.reuse:
                runs[name] = BackendRun(
                    name, plan.reuse[name].resolve(), BackendStatus.OK, 0, "", 0.0, []
                )
                continue
            current = name
            runs[name] = run_backend(
                name,
                plan.pythons[name],
                plan.launches[name],
                plan.out / name,
                plan.timeout_s,
                live.task(name),
                plan.waiting.pop(name, None),
            )
            if plan.repeat and runs[name].status == BackendStatus.OK:
                repeats[name] = run_backend(
                    name,
                    plan.pythons[name],
                    plan.launches[name],
                    plan.out / f"{name}-repeat",
                    plan.timeout_s,
                    live.task(f"{name} again"),
                )
            current = None
    except KeyboardInterrupt:
        if current is not None:
            runs.setdefault(
                current,
                BackendRun(
                    current,
                    plan.out / current,
                    BackendStatus.INTERRUPTED,
                    None,
                    "interrupted by a signal; its process group was terminated",
                    0.0,
                    [],
                ),
            )
        return Outcome(runs, repeats, True)
    finally:
        for step in plan.waiting.values():
            step.stop()
        plan.waiting.clear()
    return Outcome(runs, repeats, False)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def install_signal_handlers() -> None:
    """SIGINT, SIGTERM and SIGHUP end compare alike: the running subprocesses are taken down, temp
    folders removed, the run reported as interrupted. Installed on main's first line: no window
    without them. SIGINT too: a process started in the background by a non-interactive shell (`make
    test &`, CI) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt for it."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)

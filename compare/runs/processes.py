"""python -m compare.runs.processes: a backend run as cooperating processes (`compare --processes
N`, compare/runs/hosts.py).

compare runs this launcher where it would run the backend, in the backend's own process group: it
starts N copies of the backend command, each told its place in the run (`--coordinator HOST:PORT
--num-processes TOTAL --process-id I`: JAX's multi-controller runtime, `jax.distributed`; on host H
of a multi-host run the ids from H x N), and waits for them. This host's first process speaks for
it: its stdout (progress lines) and stderr are the launcher's; process 0 of the run writes the
record. The others' output goes to `process-<I>.log` in the run directory. When one process fails
the others are stopped (they would wait on it in a collective until their timeout), and the launcher
exits with the failed one's code, its error line said on stderr. Framework-free, like compare.

Each process is a fork of the backend's warm interpreter where one serves it (preload/, compare's
own or the test suite's): in a session of its own, which compare's kill of this launcher's group
does not reach, so the launcher stops them on SIGTERM, and the server kills each one whose launcher
is gone however it ended (SIGKILL included). Where none serves, a plain process in this launcher's
group.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from common.protocol import error_line
from preload.client import ServedProcess, start_ending_with_caller

POLL_S = 0.1
GRACE_S = 5.0


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m compare.runs.processes", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--processes", type=int, required=True, help="how many processes this launcher starts"
    )
    parser.add_argument(
        "--first-id",
        type=int,
        default=0,
        help="the process id of the first (host I of a multi-host run: I x --processes)",
    )
    parser.add_argument(
        "--total",
        type=int,
        help="the processes of the whole run, every host's (default: --processes)",
    )
    parser.add_argument("--coordinator", required=True, help="host:port of process 0")
    parser.add_argument(
        "--logs", type=Path, required=True, help="where processes 1.. write process-<I>.log"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the backend command")
    args = parser.parse_args(argv)
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    args.total = args.total or args.processes
    if (
        args.processes < 1
        or not args.command
        or not 0 <= args.first_id <= args.total - args.processes
    ):
        parser.error("needs --processes >= 1, ids within --total and a backend command after --")
    return args


def start(
    procs: list,
    command: list[str],
    processes: int,
    first_id: int,
    total: int,
    coordinator: str,
    logs: Path,
) -> None:
    """`processes` copies of the backend `command`, with ids from `first_id`, of `total`, each
    appended to `procs` as it starts (a signal meanwhile stops those started); the first speaks on
    this launcher's output, the others each to its `process-<I>.log` in `logs`."""
    for i in range(processes):
        command_i = [
            *command,
            "--coordinator",
            coordinator,
            "--num-processes",
            str(total),
            "--process-id",
            str(first_id + i),
        ]
        if i == 0:  # this host's first process speaks on the launcher's output
            procs.append((_start_one(command_i), None))
            continue
        log = logs / f"process-{first_id + i}.log"
        with open(log, "w") as out:
            io = {"stdout": out, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL}
            procs.append((_start_one(command_i, **io), log))


def _start_one(command: list[str], **io):
    """Served, ending with this launcher, where a warm interpreter serves the backend; else plain,
    in this launcher's process group."""
    return start_ending_with_caller(command, **io) or subprocess.Popen(command, **io)


def _signal(proc, sig: int) -> None:
    """A served process with its whole group (its own session: what it started goes with it); a
    plain one alone (in this launcher's group, which compare's kill reaches whole)."""
    try:
        if isinstance(proc, ServedProcess):
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except ProcessLookupError:
        pass


def stop(procs) -> None:
    """SIGTERM to every process still running, SIGKILL to any left after the grace period."""
    for proc, _ in procs:
        if proc.poll() is None:
            _signal(proc, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for proc, _ in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(proc, signal.SIGKILL)
            proc.wait()


def main(argv=None) -> int:
    args = parse_args(argv)
    # compare's kill (SIGTERM to this launcher's group) reaches no served process: stopped here
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    procs: list = []
    ended: dict[int, tuple[float, int]] = {}  # process index: (when it ended, its code)
    try:
        start(
            procs,
            args.command,
            args.processes,
            args.first_id,
            args.total,
            args.coordinator,
            args.logs,
        )
        while True:
            for i, (proc, _) in enumerate(procs):
                if i not in ended and proc.poll() is not None:
                    ended[i] = (time.monotonic(), proc.returncode)
            failed = [i for i in sorted(ended, key=lambda i: ended[i]) if ended[i][1] != 0]
            if failed:
                stop(procs)
                return said_failure(args, procs, ended, failed[0])
            if len(ended) == len(procs):
                # what the served ones left in their sessions (a plain one's: in this group, which
                # compare takes down once this launcher exits)
                for proc, _ in procs:
                    if isinstance(proc, ServedProcess):
                        _signal(proc, signal.SIGKILL)
                return 0
            time.sleep(POLL_S)
    except BaseException:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the stop short
        stop(procs)
        raise


def said_failure(args, procs, ended: dict, failed: int) -> int:
    """The first process to fail said on stderr (with its error line where its log holds one;
    process 0 says its own on this stderr), or, where one had ended with 0 before it while the
    others still ran, that one: a process that leaves early (`sys.exit(0)` in the user's code)
    leaves the others to fail waiting on it in a collective. Returns the failed one's code (128 +
    signal for a signal)."""
    at, code = ended[failed]
    log = procs[failed][1]
    line = error_line(log.read_text(errors="replace")) if log is not None else ""
    name = f"process {args.first_id + failed}"
    early = sorted((i for i, (when, c) in ended.items() if c == 0 and when < at), key=ended.get)
    if early:
        first = early[0]
        where = procs[first][1] or "this output"
        print(
            f"error: process {args.first_id + first} of {args.total} ended with code 0 "
            f"{at - ended[first][0]:.1f} s before {name} failed with code {code}"
            + (f" ({line})" if line else "")
            + ", while the others still ran: a process that leaves early leaves the others "
            f"waiting on it (its output: {where})",
            file=sys.stderr,
            flush=True,
        )
    elif log is not None:
        print(
            f"error: {name} of {args.total} exited with code {code}"
            + (f": {line}" if line else f" (see {log})"),
            file=sys.stderr,
            flush=True,
        )
    return code if code > 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())

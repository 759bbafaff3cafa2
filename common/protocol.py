"""What a process compare starts says on its way out, defined once, each printer beside its parser:
the progress line on stdout, the `error:` line on stderr, and what its exit code means
(common/vocab.py ExitCode)."""

from __future__ import annotations

import json
import re
import signal

from common.vocab import BackendStatus, ExitCode

PROGRESS = "progress"
ERROR = "error:"
# between the describe steps one process runs (python -m driver.describe_sides A ... --then B ...)
THEN = "--then"
# a describe process that goes on to make its side's run (driver/describe_sides.py): the flag it is
# started with, the line it says on stdout once its steps are done, and the one line compare answers
# on its stdin
WAIT_FOR_RUN = "--wait-for-run"
DESCRIBED = "described"

# what a backend's exit code says of its run: any other code (a crash, a signal) is FAILED
STATUS_OF_EXIT = {
    ExitCode.OK: BackendStatus.OK,
    ExitCode.USAGE: BackendStatus.USAGE_ERROR,
    ExitCode.NONFINITE: BackendStatus.NONFINITE,
    ExitCode.IO: BackendStatus.IO_ERROR,
}


def progress_line(step: int, loss: float, wall_ms: float) -> str:
    return f"{PROGRESS} step={step} loss={loss:.6g} ms={wall_ms:.3f}"


def read_progress(line: str) -> tuple[int, float, float] | None:
    """(step, loss, ms) of a progress line; None for any other line, or a progress line cut
    short."""
    if not line.startswith(f"{PROGRESS} "):
        return None
    try:
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        return int(fields["step"]), float(fields["loss"]), float(fields["ms"])
    except (KeyError, ValueError):
        return None


def run_request(module: str, argv: list[str], stderr: str) -> str:
    """The line that hands a waiting describe process its run: `python -m MODULE ARGV...`, its
    stderr to the file `stderr`."""
    return json.dumps({"run": module, "argv": argv, "stderr": stderr}) + "\n"


def read_run_request(line: str) -> tuple[str, list[str], str] | None:
    """(module, argv, stderr) of a run request; None for the end of input (compare has no run for
    it)."""
    if not line.strip():
        return None
    request = json.loads(line)
    return request["run"], list(request["argv"]), request["stderr"]


def error_text(message: str) -> str:
    return f"{ERROR} {message}"


# signals sent from outside (a kill, a timeout, Ctrl-C): the last line of a process they end says
# nothing of why; one that ended itself (an abort on a failed check, a segfault) said why last
FROM_OUTSIDE = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


# a fatal line of the glog/absl logging XLA's runtime aborts with ("F1127 05:42:36.98 1286
# client.h:80] ..."); the native stack it prints after it ("@ 0x7fa7... PyObject_Vectorcall") says
# nothing of why
_FATAL_LOG = re.compile(r"F\d{4}\b")


def error_line(stderr: str, killed: bool = False) -> str:
    """The line a failed process said it failed with: its last `error:` line, else its last fatal
    log line (an XLA abort, before its native stack), else its last line. Of a process killed from
    outside only an `error:` line: its last line is whatever it was printing when the signal
    came."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(ERROR)]
    fatal = [ln for ln in lines if _FATAL_LOG.match(ln)]
    return (errors or ([] if killed else fatal or lines) or [""])[-1].removeprefix(ERROR).strip()


def outcome(code: int, stderr: str) -> tuple[BackendStatus, str]:
    """(status, message) of a process that ended with `code` having written `stderr`."""
    if code == ExitCode.OK:
        return BackendStatus.OK, ""
    message = error_line(stderr, killed=code < 0 and -code in FROM_OUTSIDE)
    status = STATUS_OF_EXIT.get(code, BackendStatus.FAILED)
    if status == BackendStatus.FAILED:
        if code < 0:
            message = f"killed by {signal.Signals(-code).name}" + (
                f": {message}" if message else ""
            )
        message = message or f"exited with code {code}"
    return status, message

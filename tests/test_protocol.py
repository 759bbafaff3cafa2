"""common/protocol.py: each line a process compare starts prints, and its exit code, read back as
written."""

import signal

from common.protocol import error_line, error_text, outcome, progress_line, read_progress
from common.vocab import BackendStatus, ExitCode

# what torch printed last when the signal came
STRAY = "  return _C._get_float32_matmul_precision()"


def test_a_progress_line_reads_back_and_anything_else_is_no_progress():
    assert read_progress(progress_line(7, 2.3456789, 12.5)) == (7, 2.34568, 12.5)
    for line in (
        "progress",
        "progress step=1 loss=2",
        "progress stepless",
        "progress step=x loss=1 ms=2",
        "the user's print",
        "\ufffd\ufffd not utf-8",
    ):
        assert read_progress(line) is None, line  # the reader goes on: it must never stop on a line


def test_the_exit_code_and_the_error_line_make_the_status_and_its_one_line():
    said = f"warning: a framework's\n{error_text('the loss is a vector')}\n{STRAY}\n"
    assert error_line(said) == "the loss is a vector"
    assert outcome(ExitCode.OK, said) == (BackendStatus.OK, "")
    assert outcome(ExitCode.USAGE, said) == (BackendStatus.USAGE_ERROR, "the loss is a vector")
    assert outcome(ExitCode.NONFINITE, said)[0] == BackendStatus.NONFINITE
    assert outcome(ExitCode.IO, said)[0] == BackendStatus.IO_ERROR
    assert outcome(ExitCode.BACKEND, "Traceback ...\nValueError: x\n") == (
        BackendStatus.FAILED,
        "ValueError: x",
    )
    assert outcome(ExitCode.BACKEND, "") == (
        BackendStatus.FAILED,
        f"exited with code {int(ExitCode.BACKEND)}",
    )
    # a killed process: its reason is the signal and an error: line it
    # printed, never its last stray line
    assert outcome(-signal.SIGKILL, f"warning\n{STRAY}\n") == (
        BackendStatus.FAILED,
        "killed by SIGKILL",
    )
    assert outcome(-signal.SIGTERM, said) == (
        BackendStatus.FAILED,
        "killed by SIGTERM: the loss is a vector",
    )
    # a process that ended itself (an abort on a failed check) said why last
    assert outcome(-signal.SIGABRT, "F0000 Check failed: x\n") == (
        BackendStatus.FAILED,
        "killed by SIGABRT: F0000 Check failed: x",
    )


def test_an_xla_abort_is_said_by_its_fatal_line_not_by_the_native_stack_after_it():
    """Process 0 of a multi-host run whose other host never joined (it was refused its --out, say):
    the abort's own line, not the last frame of the stack printed after it."""
    stderr = (
        "I1127 05:42:28.1 1286 coordination_service.cc:611] Initializing CoordinationService\n"
        "F1127 05:42:36.984636    1286 client.h:80] Terminating process because the JAX "
        "distributed service "
        "detected fatal errors. This most likely indicates that another task died\n\n"
        "RPC: /xla.coordination.CoordinationService/RegisterTask\n*** Check failure stack trace: "
        "***\n"
        "    @     0x7fa71d158ba3  PyObject_Vectorcall\n"
    )
    status, message = outcome(134, stderr)
    assert status == BackendStatus.FAILED
    assert message.startswith(
        "F1127 05:42:36.984636    1286 client.h:80] Terminating process because the JAX "
        "distributed service detected fatal errors"
    )
    # from outside: no line
    assert outcome(-signal.SIGKILL, stderr) == (BackendStatus.FAILED, "killed by SIGKILL")

"""compare's reader of a process's stdout (compare/runs/backend_output.py): a run's log gets every
line from the first, a describe step's lines are dropped until its run is attached, and its
`described` line is noticed."""

import io

from common.protocol import DESCRIBED, progress_line
from compare.runs.backend_output import BackendOutput


def test_a_run_started_for_itself_logs_every_line_from_the_first():
    log, seen = io.StringIO(), []
    lines = "first line\n" + progress_line(0, 2.5, 1.0) + "\nlast line\n"
    # read at once, before any attach
    output = BackendOutput(io.StringIO(lines), log, lambda *p: seen.append(p))
    output.join(timeout=5)
    assert log.getvalue() == lines and seen == [(0, 2.5, 1.0)]


def test_a_describe_step_is_noticed_described_and_its_own_lines_are_not_the_runs():
    output = BackendOutput(io.StringIO(f"the factory printed this\n{DESCRIBED}\n"))
    output.join(timeout=5)
    assert output.described.is_set()
    log = io.StringIO()
    output.attach(log)
    assert log.getvalue() == ""

"""The verdict of a compare run, made in one place.

Every check returns a CheckResult: the backends' runs themselves
(`compare.reporting.report.runs_check`), parity (`compare.reporting.report.parity_check`), the
statistical test (`compare.judge.statistical.statistical_check`), determinism
(`compare.judge.determinism.determinism_check`), and whatever check comes next. `decide` folds them
into the run's one status, exit code and message by one precedence: the most serious status any
check gives wins, and the message is what the checks giving it said. A check that cannot be made at
all is an internal error (exit 6), which a failure found elsewhere still outranks: a verdict is
never a pass without every check.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.vocab import REPORT_STATUS_EXIT, ExitCode, ReportStatus

# most serious first
PRECEDENCE = (
    ReportStatus.INTERRUPTED,
    ReportStatus.USAGE_ERROR,
    ReportStatus.BACKEND_FAILED,
    ReportStatus.NOT_COMPARABLE,
    ReportStatus.PARITY_FAILED,
    ReportStatus.NONDETERMINISTIC,
    ReportStatus.INTERNAL_ERROR,
    ReportStatus.OK,
)


@dataclass(frozen=True)
class CheckResult:
    # the check's name: its section's key in report.json ("parity", "statistical", "determinism")
    check: str
    status: ReportStatus  # OK when the check passes
    message: str = ""  # why, when it does not
    # what report.json holds under `check`; None: the check writes no section
    section: object = None


def not_made(check: str, why: str) -> CheckResult:
    """A check that raised: its verdict is unknown."""
    return CheckResult(check, ReportStatus.INTERNAL_ERROR, f"could not build {check} ({why})")


def decide(results: list[CheckResult]) -> tuple[ReportStatus, ExitCode, str]:
    """(status, exit code, message) of the run from every check's result."""
    status = min((r.status for r in results), key=PRECEDENCE.index, default=ReportStatus.OK)
    message = "; ".join(r.message for r in results if r.status == status and r.message)
    return status, REPORT_STATUS_EXIT[status], message

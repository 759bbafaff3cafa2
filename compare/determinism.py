"""`--check-determinism`: each backend ran twice; are the per-step losses of the two runs bitwise equal?"""
from __future__ import annotations

from common.record import RecordError, read_record
from common.vocab import REPORT_STATUS_EXIT, ExitCode, ReportStatus


def judge_determinism(report: dict, runs: dict, repeats: dict) -> dict:
    """Adds `determinism` to the report; a passing report whose repeats differ becomes `nondeterministic`."""
    result = {}
    for name, repeat in repeats.items():
        try:
            first, second = read_record(runs[name].run_dir).losses, read_record(repeat.run_dir).losses
        except RecordError as e:
            result[name] = {"bitwise_equal": False, "message": f"repeat run unusable: {e}"}
            continue
        diffs = [abs(a - b) for a, b in zip(first, second) if a is not None and b is not None]
        result[name] = {"bitwise_equal": first == second, "max_abs": max(diffs) if diffs else None,
                        "steps": len(first)}
    report["determinism"] = result
    if report["exit_code"] == ExitCode.OK and not all(r["bitwise_equal"] for r in result.values()):
        status = ReportStatus.NONDETERMINISTIC
        report.update(status=status, exit_code=REPORT_STATUS_EXIT[status], verdict="fail",
                      message="two identical runs differ: " + ", ".join(n for n, r in result.items()
                                                                         if not r["bitwise_equal"]))
    return report

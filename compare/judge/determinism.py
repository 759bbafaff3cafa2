"""`--check-determinism`: each backend ran twice; are the per-step losses of the two runs bitwise
equal?"""

from __future__ import annotations

from common.files.record import RecordError, read_record
from common.vocab import ReportStatus
from compare.judge.verdict import CheckResult


def determinism_check(runs: dict, repeats: dict) -> CheckResult:
    """report.json's `determinism`, per backend; repeats that differ make the run
    `nondeterministic`."""
    result = {}
    for name, repeat in repeats.items():
        try:
            first, second = (
                read_record(runs[name].run_dir).losses,
                read_record(repeat.run_dir).losses,
            )
        except RecordError as e:
            result[name] = {"bitwise_equal": False, "message": f"repeat run unusable: {e}"}
            continue
        diffs = [abs(a - b) for a, b in zip(first, second) if a is not None and b is not None]
        result[name] = {
            "bitwise_equal": first == second,
            "max_abs": max(diffs) if diffs else None,
            "steps": len(first),
        }
    differ = [n for n, r in result.items() if not r["bitwise_equal"]]
    if differ:
        return CheckResult(
            "determinism",
            ReportStatus.NONDETERMINISTIC,
            "two identical runs differ: " + ", ".join(differ),
            result,
        )
    return CheckResult("determinism", ReportStatus.OK, "", result)

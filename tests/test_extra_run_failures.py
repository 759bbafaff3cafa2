"""An extra run the verdict rests on (here a bfloat16 run's noise floor) that dies, or a signal to
compare while it runs, ends compare as the failure or the interrupt it is: exit 3 naming the run
and how it ended, or exit 4 with the run directory marked interrupted; never a verdict made
without it (exit 1 `parity_failed`, advising to rerun what just died)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import processes_under, run_cli
from tests.test_reliability import executable


def _dying_in_the_floor(tmp_path: Path, how: str) -> Path:
    """The torch backend's interpreter, but for its noise-floor run, which `how` ends."""
    return executable(
        tmp_path / "python-dies-in-floor",
        f'#!/bin/sh\ncase "$*" in *noise-floor*) {how} ;; esac\nexec {sys.executable} "$@"\n',
    )


def _compare(tmp_path: Path, python: Path):
    out = tmp_path / "run"
    proc = run_cli(
        "compare",
        "--quiet",
        "--backend",
        "jax,torch",
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
        "--dtype",
        "bfloat16",
        "--torch-python",
        str(python),
        "--out",
        str(out),
    )
    return proc, out, json.loads((out / "report.json").read_text())


@pytest.mark.slow
@pytest.mark.error_case("extra-run-failed")
def test_a_noise_floor_run_killed_is_a_backend_failure_naming_it(tmp_path):
    proc, out, report = _compare(tmp_path, _dying_in_the_floor(tmp_path, "kill -9 $$"))
    assert proc.returncode == 3 and report["status"] == "backend_failed", report["message"]
    assert report["message"].startswith("the noise-floor run of torch failed: failed: "), report[
        "message"
    ]
    assert "SIGKILL" in report["message"] and "rerun" not in report["message"]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: {report['message']}"], proc.stderr
    assert report["backends"]["torch"]["status"] == "ok"  # its own run is not the one that died


@pytest.mark.slow
@pytest.mark.error_case("extra-run-interrupted")
def test_a_signal_during_a_noise_floor_run_ends_compare_interrupted(tmp_path):
    proc, out, report = _compare(
        tmp_path,
        _dying_in_the_floor(
            tmp_path,
            "sleep 1; kill -TERM $PPID; sleep 60",  # (once compare holds its group)
        ),
    )
    assert proc.returncode == 4 and report["status"] == "interrupted", report["message"]
    assert not processes_under(tmp_path)

"""The Python API: `check_twin(...)` runs exactly what `python -m compare --twin` runs (the same
subprocesses, the same run directory) and returns the report as an object.

    from compare import check_twin
    report = check_twin("examples/llama/twin.py:llama_tiny", steps=10)
    assert report.passed, report.message
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from compare.orchestrate import backend_env, error_line

DEFAULT_BACKENDS = "jax,torch"  # the NNX port against eager PyTorch, the ground truth of the torch side


class CompareError(RuntimeError):
    """compare refused the input (no report was written); the message is its one-line error."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Report:
    """report.json of one run, with the answers a test needs."""

    data: dict
    path: Path  # the run directory
    exit_code: int

    @property
    def passed(self) -> bool:
        return self.data["verdict"] == "pass"

    @property
    def status(self) -> str:
        return self.data["status"]

    @property
    def message(self) -> str:
        """Why it failed, in one paragraph: the parity message and where each port first parts."""
        text = self.data.get("message") or f"verdict {self.data['verdict']} ({self.status})"
        return f"{text} (report: {self.path / 'report.md'})"

    def first_divergent_module(self, backend: str) -> str | None:
        found = ((self.data.get("parity") or {}).get(backend) or {}).get("first_divergent_module")
        return found["module"] if found else None


def check_twin(twin: str, *, backends: str | Sequence[str] = DEFAULT_BACKENDS, out: str | Path | None = None,
               steps: int | None = None, mesh: str | None = None, sets: Sequence[str] = (), seed: int | None = None,
               dtype: str | None = None, tolerance_profile: str | None = None, timeout_s: float | None = None,
               extra_args: Sequence[str] = (), python: str = sys.executable) -> Report:
    """Compare a twin (`FILE_OR_MODULE:NAME`) on this machine. Returns the Report whatever the verdict;
    raises CompareError when compare refuses the input (exit 2 before any run directory exists)."""
    out = Path(out) if out else Path("runs") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    argv = ["--twin", twin, "--backend", backends if isinstance(backends, str) else ",".join(backends),
            "--out", str(out), "--overwrite", "--quiet"]
    for flag, value in (("--steps", steps), ("--mesh", mesh), ("--seed", seed), ("--dtype", dtype),
                        ("--tolerance-profile", tolerance_profile), ("--timeout", timeout_s)):
        if value is not None:
            argv += [flag, str(value)]
    argv += [a for item in sets for a in ("--set", item)] + list(extra_args)
    started = time.time()
    proc = subprocess.run([python, "-m", "compare", *argv], capture_output=True, text=True, env=backend_env())
    report_path = out / "report.json"
    # a report older than this call is an earlier run's: compare refused this one before writing any
    if not report_path.exists() or report_path.stat().st_mtime < started - 1:
        raise CompareError(error_line(proc.stderr) or f"compare exited with code {proc.returncode}", proc.returncode)
    return Report(json.loads(report_path.read_text()), out.resolve(), proc.returncode)

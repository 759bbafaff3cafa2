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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common.protocol import error_line
from compare.runs.orchestrate import backend_env
from compare.runs.rundir import default_out, new_run_id

# the NNX port against eager PyTorch, the ground truth of the torch side
DEFAULT_BACKENDS = "jax,torch"


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


def check_twin(
    twin: str,
    *,
    backends: str | Sequence[str] = DEFAULT_BACKENDS,
    out: str | Path | None = None,
    steps: int | None = None,
    mesh: str | None = None,
    sets: Sequence[str] = (),
    seed: int | None = None,
    dtype: str | None = None,
    generate: int | None = None,
    tolerance_profile: str | None = None,
    timeout_s: float | None = None,
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
) -> Report:
    """Compare a twin (`FILE_OR_MODULE:NAME`) on this machine. Returns the Report whatever the
    verdict; raises CompareError when compare refuses the input (exit 2 before any run directory
    exists)."""
    run_id = new_run_id()
    out = Path(out) if out else default_out(run_id)
    argv = [
        "--twin",
        twin,
        "--backend",
        backends if isinstance(backends, str) else ",".join(backends),
        "--out",
        str(out),
        "--run-id",
        run_id,
        "--overwrite",
        "--quiet",
    ]
    for flag, value in (
        ("--steps", steps),
        ("--mesh", mesh),
        ("--seed", seed),
        ("--dtype", dtype),
        ("--generate", generate),
        ("--tolerance-profile", tolerance_profile),
        ("--timeout", timeout_s),
    ):
        if value is not None:
            argv += [flag, str(value)]
    argv += [a for item in sets for a in ("--set", item)] + list(extra_args)
    proc = subprocess.run(
        [python, "-m", "compare", *argv], capture_output=True, text=True, env=backend_env()
    )
    data = _report_of_run(out / "report.json", run_id)
    # compare refused this run before writing a report: what is there is another run's
    if data is None:
        raise CompareError(
            error_line(proc.stderr) or f"compare exited with code {proc.returncode}",
            proc.returncode,
        )
    return Report(data, out.resolve(), proc.returncode)


def _report_of_run(path: Path, run_id: str) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("run_id") == run_id else None

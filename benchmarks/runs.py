"""Whole runs, as users start them: `python -m compare` per preset (the default one is the wall-time
figure) and the torch_xla backend alone in its other trace modes. Figures come from the reports and
records those runs write; each run is repeated and summarized as median, min and max."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.timing import spread
from common import backends
from common.files.record import read_record
from compare.explain.figures import compile_summary, step_times

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PRESET = "gpt-tiny"  # what `python -m compare --backend both` runs


def timed(cmd: list[str], what: str, cwd: Path = REPO) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return time.perf_counter() - start


def compare_run(preset: str, out: Path, cache: Path, twin: str | None = None) -> dict:
    """One `python -m compare --backend both` (the default command for the default preset), its
    compile cache in `cache` (empty: a first run; filled by an earlier run: a repeat run); `twin`:
    of that user twin (`--twin FILE:NAME`) on jax and eager torch instead."""
    cmd = [
        sys.executable,
        "-m",
        "compare",
        "--backend",
        "jax,torch" if twin else "both",
        "--quiet",
        "--out",
        str(out),
        "--compile-cache",
        str(cache),
    ]
    if twin:
        cmd += ["--twin", twin]
    elif preset != DEFAULT_PRESET:
        cmd += ["--spec", preset]
    wall = timed(cmd, f"compare {twin or preset}")
    report = json.loads((out / "report.json").read_text())
    figures = {name: _figures(b) for name, b in report["backends"].items()}
    return {
        "process_wall_s": wall,
        "verdict": report["verdict"],
        "wall_time": report["wall_time"],
        "wall_over_frameworks": wall_over_frameworks(wall, report),
        "backends": figures,
    }


def wall_over_frameworks(wall_s: float, report: dict) -> float | None:
    """The whole command's wall time over the frameworks' own share of it: every backend's start and
    imports, compiles and steps, as compare's wall breakdown reports them, and a twin's preparation
    (its sides' describe steps, which import the frameworks and build the models; the twin file's
    import check and the numpy conversion in it, ~0.3 s, counted with them), and the time its
    processes waited on their warm interpreters' imports. The rest is the toolkit's."""
    parts = [b.get("wall_breakdown") for b in report["backends"].values()]
    if not parts or not all(parts):
        return None
    wall = report["wall_time"]
    prepared = wall["prepare_s"] if report["spec"]["model"].get("twin") else 0.0
    # the time its processes waited on their warm interpreters' imports (compare/runs/warm.py):
    # the frameworks', made once for every process of the run (inside prepare_s for a twin)
    warm = 0.0 if prepared else (wall.get("processes") or {}).get("waited_s", 0.0)
    return wall_s / (
        prepared
        + warm
        + sum(p["start_and_imports_s"] + p["compile_s"] + p["steps_s"] for p in parts)
    )


def mode_run(preset: str, mode: str, out: Path) -> dict:
    """The torch_xla backend alone in trace mode `mode`."""
    cmd = [
        sys.executable,
        "-m",
        backends.info("torch_xla").package,
        "--spec",
        preset,
        "--trace-mode",
        mode,
        "--out",
        str(out),
    ]
    timed(cmd, f"torch_xla {preset} --trace-mode {mode}")
    record = read_record(out)
    step_ms, trace_ms = step_times(record)
    compiles = compile_summary(record)
    return {
        "step_ms": step_ms["median"],
        "trace_ms": trace_ms["median"] if trace_ms else None,
        "pipelined_ms": 1e3 / record.throughput["steps_per_s"],
        "compile_s": compiles["compile_s"],
        "loop_compiles": compiles["loop"],
        "steady_state_recompiles": compiles["steady_state"],
        "peak_rss_mb": record.peak_rss_mb,
    }


def _figures(backend: dict) -> dict:
    compiles = backend["compiles"]
    return {
        "step_ms": backend["step_ms"]["median"],
        "pipelined_ms": 1e3 / backend["throughput"]["steps_per_s"],
        "compile_s": compiles["compile_s"],
        "steady_state_recompiles": compiles["steady_state"],
        "cache_hits": compiles["cache_hits"],
        "mfu": backend["mfu"],
        "peak_rss_mb": backend["peak_rss_mb"],
        **{f"wall_{k}": v for k, v in (backend.get("wall_breakdown") or {}).items()},
    }


def summarize_repeats(runs: list[dict]) -> dict:
    """Median/min/max over repeats of every numeric leaf (same structure as one run)."""
    first = runs[0]
    if isinstance(first, dict):
        return {
            k: summarize_repeats([r[k] for r in runs]) for k in first if all(k in r for r in runs)
        }
    if (
        isinstance(first, (int, float))
        and not isinstance(first, bool)
        and all(r is not None for r in runs)
    ):
        return spread([float(r) for r in runs])
    return first if all(r == first for r in runs) else runs

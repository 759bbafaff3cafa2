"""python -m benchmarks: toolkit step vs minimal hand-written loop, per backend and preset.

Each (backend, preset) runs in its own subprocess (frameworks never share a
process here either) and measures both loops side by side, interleaved.
Prints a table and writes the JSON to --out (default runs/benchmarks-<time>.json).
Target: toolkit/minimal <= 1.03.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from common.fsutil import write_json_atomic

TARGET = 1.03
REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--presets", default="mlp-tiny,cnn-digits,gpt-tiny")
    parser.add_argument("--backends", default="jax,torch_xla")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results, failures = [], []
    for backend in args.backends.split(","):
        for preset in args.presets.split(","):
            cmd = [sys.executable, "-m", f"benchmarks.overhead_{backend}", "--spec", preset,
                   "--rounds", str(args.rounds)]
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                failures.append(f"{backend} {preset}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
                continue
            results.append(json.loads(lines[-1]))
    table = Table(title=f"Toolkit train step vs minimal hand-written loop (target ratio <= {TARGET})")
    for column in ("backend", "preset", "minimal ms", "toolkit ms", "ratio", "trace share", "target"):
        table.add_column(column)
    for r in results:
        ratio = r["toolkit"]["ratio_to_minimal"]
        share = r["toolkit"].get("trace_share")
        table.add_row(r["backend"], r["spec"], f"{r['minimal']['median_ms']:.3f}", f"{r['toolkit']['median_ms']:.3f}",
                      f"{ratio:.3f}", "-" if share is None else f"{share:.0%}", "met" if ratio <= TARGET else "MISSED")
    Console().print(table)
    out = args.out or REPO / "runs" / f"benchmarks-{time.strftime('%Y%m%d-%H%M%S')}.json"
    write_json_atomic(out, {"target": TARGET, "results": results, "failures": failures})
    print(f"written: {out}")
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

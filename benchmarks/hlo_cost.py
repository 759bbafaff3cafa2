"""What the compiled-program analysis costs a backend run: wall time with it over wall time without
it.

    # gpt-tiny, jax / torch_xla / torchax, 3 pairs each
    python -m benchmarks.hlo_cost
    python -m benchmarks.hlo_cost --spec mlp-tiny --pairs 5

Per backend, `python -m <backend> --spec S --parity` and the same with `--no-hlo` run alternately
(the order swaps every pair), each a whole process as compare starts it (the spec's own steps and
pipelined steps, no compile cache); the ratio of the median wall times
is the analysis's cost (target <= 1.10). For torch_xla that is XLA's dump of every compiled module
plus its reading; for the JAX runtimes the ahead-of-time lowering, compile and memory analysis of
the step. compare's own reading of the saved HLO (analysis.hlo) is timed apart. Prints a table and
one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from common import backends

REPO = Path(__file__).resolve().parents[1]
MODULES = {r.name: r.package for r in backends.registry().values() if r.compiles}


def backend_wall_s(module: str, spec: str, steps: int, out: Path, *flags: str) -> float:
    cmd = [sys.executable, "-m", module, "--spec", spec, "--parity", "--out", str(out), *flags]
    if steps:
        cmd += ["--steps", str(steps)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return wall


def summary_ms(run_dir: Path) -> float:
    """compare's reading of one run's compiled program (what report.json's `hlo` costs compare)."""
    from common.files.record import read_record
    from compare.explain.program import compiled_program

    record = read_record(run_dir)
    start = time.perf_counter()
    compiled_program(record, run_dir)
    return (time.perf_counter() - start) * 1e3


def measure(backend: str, spec: str, steps: int, pairs: int, tmp: Path) -> dict:
    with_hlo, without = [], []
    for i in range(pairs):
        runs = [("with", ()), ("without", ("--no-hlo",))]
        for label, flags in runs if i % 2 == 0 else runs[::-1]:
            wall = backend_wall_s(
                MODULES[backend], spec, steps, tmp / f"{backend}-{label}-{i}", *flags
            )
            (with_hlo if label == "with" else without).append(wall)
    with_s, without_s = statistics.median(with_hlo), statistics.median(without)
    return {
        "backend": backend,
        "spec": spec,
        "with_hlo_s": with_hlo,
        "without_hlo_s": without,
        "ratio": with_s / without_s,
        "compare_summary_ms": summary_ms(tmp / f"{backend}-with-0"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.hlo_cost", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--spec", default="gpt-tiny")
    parser.add_argument(
        "--steps", type=int, default=0, help="train steps (default: the spec's, as compare runs it)"
    )
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--backends", default="jax,torch_xla,torchax")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="hlo-cost-") as tmp:
        for backend in args.backends.split(","):
            results.append(measure(backend, args.spec, args.steps, args.pairs, Path(tmp)))
    table = Table(
        title=f"HLO analysis cost, {args.spec}, {args.steps or 'spec'} steps, {args.pairs} "
        "alternating pairs "
        "(target: with / without <= 1.10)",
        title_justify="left",
    )
    for column in (
        "backend",
        "with HLO (s, median)",
        "without (s, median)",
        "with / without",
        "compare's reading (ms)",
    ):
        table.add_column(column)
    for r in results:
        table.add_row(
            r["backend"],
            f"{statistics.median(r['with_hlo_s']):.2f}",
            f"{statistics.median(r['without_hlo_s']):.2f}",
            f"{r['ratio']:.3f}",
            f"{r['compare_summary_ms']:.1f}",
        )
    Console(width=160).print(table)
    print(json.dumps({"spec": args.spec, "steps": args.steps, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What common's dropout masks (`--parity-mode exact`) cost a step: median step time with them over
the same run with each framework's own masks.

    # gpt-tiny, dropout 0.1, every backend, 3 pairs
    python -m benchmarks.exact_masks
    python -m benchmarks.exact_masks --backends jax,torch_xla --pairs 5

Per backend, `python -m <backend> --spec S --set model.dropout=D` with
`train.dropout_masks=framework` and `=common` run alternately (the order swaps every pair); each
run's median synced step (after its timing warm-up) is read from its record, and the ratio of the
medians over the pairs is the cost. The common masks are drawn in numpy on the host each step and go
in as inputs (jitted runtimes) or are uploaded as the step traces (eager torch, torch_xla). Prints a
table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from common import backends
from common.files.record import read_record
from common.vocab import MaskSource, values
from compare.explain.figures import step_times

REPO = Path(__file__).resolve().parents[1]


def median_step_ms(
    backend: str, spec: str, dropout: float, masks: str, steps: int, out: Path
) -> float:
    cmd = [
        sys.executable,
        "-m",
        backends.info(backend).package,
        "--spec",
        spec,
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--throughput-steps",
        "0",
        "--no-hlo",
        "--set",
        f"model.dropout={dropout}",
        "--set",
        f"train.dropout_masks={masks}",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return step_times(read_record(out))[0]["median"]


def measure(backend: str, args, tmp: Path) -> dict:
    medians = {m: [] for m in values(MaskSource)}
    for i in range(args.pairs):
        order = values(MaskSource) if i % 2 == 0 else values(MaskSource)[::-1]
        for masks in order:
            medians[masks].append(
                median_step_ms(
                    backend,
                    args.spec,
                    args.dropout,
                    masks,
                    args.steps,
                    tmp / f"{backend}-{masks}-{i}",
                )
            )
    framework, common = (
        statistics.median(medians[m]) for m in (MaskSource.FRAMEWORK, MaskSource.COMMON)
    )
    return {"backend": backend, "step_ms": medians, "ratio": common / framework}


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.exact_masks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--spec", default="gpt-tiny")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--backends", default=",".join(backends.names()))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="exact-masks-") as tmp:
        results = [measure(backend, args, Path(tmp)) for backend in args.backends.split(",")]
    table = Table(
        title=f"Common dropout masks' cost, {args.spec}, dropout {args.dropout}, {args.steps} "
        "steps, "
        f"{args.pairs} alternating pairs",
        title_justify="left",
    )
    for column in (
        "backend",
        "framework masks (ms, median)",
        "common masks (ms, median)",
        "common / framework",
    ):
        table.add_column(column)
    for r in results:
        table.add_row(
            r["backend"],
            f"{statistics.median(r['step_ms']['framework']):.2f}",
            f"{statistics.median(r['step_ms']['common']):.2f}",
            f"{r['ratio']:.3f}",
        )
    Console(width=160).print(table)
    print(
        json.dumps(
            {"spec": args.spec, "dropout": args.dropout, "steps": args.steps, "results": results}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

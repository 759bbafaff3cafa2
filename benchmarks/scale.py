"""python -m benchmarks.scale: what a comparison costs as the model grows, per `--tensors` mode.

A ladder of GPT sizes (gpt-tiny, GPT-2 small, a GPT-2 medium shape), each compared as users start it
(`python -m compare --backend jax,torch`, float32, a small batch so that the larger sizes fit this
machine), in the `full` and `auto` modes. Per size and mode: the command's wall time, the disk each
backend's run directory takes (its tensor file apart), the peak RSS of compare itself and of each
backend (from the report), and how each grows with the parameter count: the exponent k of cost ~
params^k between the two largest sizes. Prints a markdown table (for docs/performance.md) and writes
the JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common.files.fsutil import write_json_atomic
from common.presets import load_spec
from common.weights import param_count

REPO = Path(__file__).resolve().parents[1]
# 4 x 128 tokens: the 355M size fits 24 GB
BATCH = ["train.global_batch_size=4", "model.seq_len=128"]
SIZES = {  # name: (preset, overrides)
    "gpt-tiny": ("gpt-tiny", BATCH),
    "gpt2-small": ("gpt2-small", BATCH),
    "gpt2-medium shape": (
        "gpt2-small",
        [*BATCH, "model.d_model=1024", "model.n_layers=24", "model.n_heads=16", "model.d_ff=4096"],
    ),
}
FIGURES = ("wall_s", "disk_mb", "tensors_mb", "compare_rss_mb", "backend_rss_mb")


def _bytes(folder: Path, name: str | None = None) -> int:
    return sum(p.stat().st_size for p in folder.rglob(name or "*") if p.is_file())


def run_point(
    preset: str, overrides: list[str], mode: str, backends: str, steps: int, out: Path
) -> dict:
    """One `python -m compare` of a size in a tensor mode, and what it cost."""
    sets = [a for o in [*overrides, f"train.steps={steps}"] for a in ("--set", o)]
    cmd = [
        sys.executable,
        "-m",
        "compare",
        "--spec",
        preset,
        *sets,
        "--backend",
        backends,
        "--dtype",
        "float32",
        "--tensors",
        mode,
        "--quiet",
        "--no-compile-cache",
        "--out",
        str(out),
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1) or not (out / "report.json").exists():
        raise RuntimeError(
            f"{' '.join(cmd[2:])}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
        )
    report = json.loads((out / "report.json").read_text())
    names = report["backend_names"]
    return {
        "verdict": report["verdict"],
        "wall_s": wall,
        "disk_mb": max(_bytes(out / n) for n in names) / 2**20,
        "tensors_mb": max(_bytes(out / n, "tensors.npz") for n in names) / 2**20,
        "compare_rss_mb": report["compare_peak_rss_mb"],
        "backend_rss_mb": max(report["backends"][n]["peak_rss_mb"] for n in names),
    }


def exponents(points: list[dict]) -> dict:
    """k in cost ~ params^k between the two largest sizes, per figure."""
    a, b = sorted(points, key=lambda p: p["params"])[-2:]
    ratio = math.log(b["params"] / a["params"])
    return {f: math.log(b[f] / a[f]) / ratio if a[f] and b[f] else None for f in FIGURES}


def _row(mode: str, p: dict) -> str:
    share = p["tensors_mb"] * 2**20 / (4 * p["params"])  # of the float32 parameter bytes
    return (
        f"| {p['size']} | {p['params'] / 1e6:.1f}M | {mode} | {p['verdict']} | {p['wall_s']:.0f} "
        "s | "
        f"{p['disk_mb']:.1f} MB ({p['tensors_mb']:.1f} MB: {share:.1%}) | "
        f"{p['compare_rss_mb']:.0f} MB | "
        f"{p['backend_rss_mb']:.0f} MB |"
    )


def table(results: dict) -> str:
    lines = [
        "| size | parameters | --tensors | verdict | wall | disk per backend (tensors.npz: of the "
        "parameter "
        "bytes) | compare peak RSS | backend peak RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(mode, p) for mode, points in results["points"].items() for p in points]
    lines += [
        "",
        "| growth exponent k (cost ~ params^k, two largest sizes) | " + " | ".join(FIGURES) + " |",
        "|---|" + "---|" * len(FIGURES),
    ]
    for mode, k in results["exponents"].items():
        lines.append(
            f"| {mode} | "
            + " | ".join("-" if k.get(f) is None else f"{k[f]:.2f}" for f in FIGURES)
            + " |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.scale", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--sizes", default=",".join(SIZES), help=f"comma list of {', '.join(SIZES)}"
    )
    parser.add_argument("--modes", default="full,auto", help="comma list of --tensors modes")
    parser.add_argument("--backends", default="jax,torch")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument(
        "--out", type=Path, default=Path("runs") / f"scale-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    args = parser.parse_args(argv)
    sizes = args.sizes.split(",")
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown size {unknown[0]!r}; one of {', '.join(SIZES)}")
    results = {
        "backends": args.backends,
        "steps": args.steps,
        "batch": BATCH,
        "points": {},
        "exponents": {},
    }
    for mode in args.modes.split(","):
        points = []
        for size in sizes:
            preset, overrides = SIZES[size]
            folder = Path(tempfile.mkdtemp(prefix="xla-twins-scale-"))
            try:
                point = run_point(
                    preset, overrides, mode, args.backends, args.steps, folder / "run"
                )
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            points.append(
                {"size": size, "params": param_count(load_spec(preset, overrides).model), **point}
            )
            print(f"{size} {mode}: {json.dumps(points[-1])}", flush=True)
        results["points"][mode] = points
        results["exponents"][mode] = exponents(points) if len(points) > 1 else {}
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

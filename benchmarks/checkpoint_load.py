"""Checkpoint load + conversion per backend vs a plain safetensors load of the same file, side by
side.

    # gpt2-small-sized random weights (124M parameters)
    python -m benchmarks.checkpoint_load
    python -m benchmarks.checkpoint_load --spec gpt-tiny --backends jax,torch

Writes the canonical checkpoint once; then, per backend in its own process, times a plain
`safetensors.numpy.load_file` of it, builds the backend's trainer from it (what its record reports
as `extra.start.load_and_convert_s`: reading the file and putting the weights into the runtime's
model and layout) and times the plain load again. Reports the trainer's figure over the median plain
load (target <= 2). Prints a table and one JSON line.
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

REPO = Path(__file__).resolve().parents[1]
TRAINERS = {
    "jax": "jax_impl.train:JaxTrainer",
    "torch": "torch_impl.train:TorchTrainer",
    "torch_xla": "torch_xla_impl.train:TorchXlaTrainer",
    "torchax": "torchax_impl.train:TorchaxTrainer",
}


def plain_load_s(path: Path) -> float:
    from safetensors.numpy import load_file

    start = time.perf_counter()
    load_file(str(path))
    return time.perf_counter() - start


def measure_backend(backend: str, spec_name: str, path: Path) -> dict:
    """In this process (one backend's interpreter): plain, trainer, plain."""
    from common.presets import load_spec

    spec = load_spec(spec_name, ["train.dtype=float32"])
    module, cls = TRAINERS[backend].split(":")
    plain = [plain_load_s(path)]
    from driver.harness import RunOptions

    options, factory = (
        RunOptions(checkpoint=str(path)),
        getattr(__import__(module, fromlist=[cls]), cls),
    )
    if backend in ("jax", "torchax"):
        from jax_impl import sharding
        from jax_impl.instrument import CompileMonitor

        trainer = factory(spec, sharding.make_mesh(spec.mesh), options, CompileMonitor())
    else:
        trainer = factory(spec, options)
    plain.append(plain_load_s(path))
    loaded = trainer.start["load_and_convert_s"]
    return {
        "backend": backend,
        "plain_load_s": plain,
        "load_and_convert_s": loaded,
        "ratio": loaded / statistics.median(plain),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.checkpoint_load", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--spec", default="gpt2-small")
    parser.add_argument("--backends", default="jax,torch,torch_xla,torchax")
    # internal: backend:path, in its own process
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        backend, _, path = args.measure.partition(":")
        print(json.dumps(measure_backend(backend, args.spec, Path(path))))
        return 0
    from common.presets import load_spec
    from common.weights import init_params, param_count, save_checkpoint

    spec = load_spec(args.spec)
    rows = []
    with tempfile.TemporaryDirectory(prefix="checkpoint-load-") as tmp:
        path = Path(tmp) / "weights.safetensors"
        save_checkpoint(path, init_params(spec.model, 0))
        size_mb = path.stat().st_size / 2**20
        for backend in args.backends.split(","):
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.checkpoint_load",
                    "--spec",
                    args.spec,
                    "--measure",
                    f"{backend}:{path}",
                ],
                cwd=REPO,
                capture_output=True,
                text=True,
            )
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode or not lines:
                print(f"error: {backend}: {proc.stderr.strip()[-400:]}", file=sys.stderr)
                return 1
            rows.append(json.loads(lines[-1]))
    print(
        f"{args.spec}: {param_count(spec.model) / 1e6:.1f}M parameters, {size_mb:.0f} MiB of "
        "safetensors"
    )
    print("| backend | plain safetensors load (s) | load + conversion (s) | ratio (target <= 2) |")
    print("|---|---|---|---|")
    for r in rows:
        plain = ", ".join(f"{p:.3f}" for p in r["plain_load_s"])
        print(f"| {r['backend']} | {plain} | {r['load_and_convert_s']:.3f} | {r['ratio']:.2f} |")
    print(json.dumps({"spec": args.spec, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

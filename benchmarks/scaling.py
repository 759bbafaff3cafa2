"""python -m benchmarks.scaling: step time and throughput as the GPT spec grows and as (fake)
devices grow.

Each point is one backend run as users start it (`python -m jax_impl` /
`python -m torch_xla_impl`, gpt-tiny with `--set` overrides), read back from
its run record. Devices are the CPU split into fake devices (JAX:
--xla_force_host_platform_device_count, torch_xla: CPU_NUM_DEVICES under
SPMD), data parallel over the mesh's data axis; on a 2-core machine more
devices share the same cores, so this measures partitioning overhead, not speedup.
Prints a markdown table (for docs/performance.md) and writes the JSON.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import backends
from common.files.fsutil import write_json_atomic
from common.files.record import read_record
from compare.explain.figures import step_times

REPO = Path(__file__).resolve().parents[1]
SIZES = {  # name: --set overrides of gpt-tiny
    "d64 L2 (gpt-tiny)": [],
    "d128 L4": ["model.d_model=128", "model.n_layers=4", "model.d_ff=512"],
    "d256 L4": ["model.d_model=256", "model.n_layers=4", "model.d_ff=1024", "model.n_heads=8"],
}
DEVICES = {"jax": (1, 2, 4, 8), "torch_xla": (1, 2, 4)}
MODULES = {name: backends.info(name).package for name in DEVICES}


def point(backend: str, overrides: list[str], out: Path, steps: int) -> dict:
    sets = [a for o in [*overrides, f"train.steps={steps}"] for a in ("--set", o)]
    cmd = [sys.executable, "-m", MODULES[backend], "--spec", "gpt-tiny", *sets, "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd[2:])}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
        )
    record = read_record(out)
    step_ms, _ = step_times(record)
    return {
        "step_ms": step_ms["median"],
        "tokens_per_s": record.throughput["tokens_per_s"],
        "device_count": record.platform["device_count"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.scaling", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="scaling-") as tmp:
        cases = [("model", name, 1, sets) for name, sets in SIZES.items()]
        cases += [
            ("devices", f"{n} devices, dp={n}", n, [f"mesh.data={n}"]) for n in DEVICES["jax"]
        ]
        for i, (axis, label, devices, sets) in enumerate(cases):
            row = {"axis": axis, "case": label}
            for backend in MODULES:
                if axis == "devices" and devices not in DEVICES[backend]:
                    continue
                print(f"{backend}: {label}", file=sys.stderr, flush=True)
                row[backend] = point(backend, sets, Path(tmp) / f"{i}-{backend}", args.steps)
            rows.append(row)
    lines = [
        "| scaling | case | JAX ms/step | torch_xla ms/step | torch_xla / JAX | JAX tokens/s | "
        "torch_xla tokens/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        j, t = row.get("jax"), row.get("torch_xla")
        cell = lambda b, k, f: format(b[k], f) if b else "-"  # noqa: E731
        ratio = f"{t['step_ms'] / j['step_ms']:.2f}" if j and t else "-"
        lines.append(
            f"| {row['axis']} | {row['case']} | {cell(j, 'step_ms', '.2f')} | "
            f"{cell(t, 'step_ms', '.2f')} | "
            f"{ratio} | {cell(j, 'tokens_per_s', '.3g')} | {cell(t, 'tokens_per_s', '.3g')} |"
        )
    print("\n".join(lines))
    out = args.out or REPO / "runs" / f"scaling-{time.strftime('%Y%m%d-%H%M%S')}.json"
    write_json_atomic(out, {"steps": args.steps, "rows": rows})
    print(f"written: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""python -m benchmarks: is the toolkit as fast as the frameworks, and what does a comparison cost?

1. Per backend (jax, torch_xla, eager torch, torchax) and preset, and per user
   twin (`--twins`, default the Llama example, started from its torch init as
   compare starts it), in one subprocess each, interleaved side by side: the
   toolkit's step vs a minimal hand-written loop; instrumented vs
   uninstrumented; for torch_xla the three trace modes.
2. Per preset, whole runs repeated `--repeats` times: `python -m compare
   --backend both` (synced vs pipelined step, compile time, steady-state
   recompiles, MFU, peak RSS; for gpt-tiny, the default command, its wall
   time and breakdown) and the torch_xla backend in compile and dynamo mode. Every whole run starts
   from an empty compile cache; the default command is then run once more on the cache it filled
   (cold vs warm).
3. The import time of compare and of each backend process: the toolkit's own modules apart.
Prints the tables, writes the JSON (default runs/benchmarks-<time>.json) and
exits 1 when a run failed, 0 otherwise: a missed target is shown, not an error.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from benchmarks import runs, startup, tables
from common.files.fsutil import write_json_atomic
from preload import client as preload_client

REPO = Path(__file__).resolve().parents[1]
TARGETS = {
    "toolkit_over_minimal": 1.03,
    "instrumented_over_uninstrumented": 1.01,
    "steady_state_recompiles": 0,
    "default_compare_wall_s": 60.0,
    "warm_over_cold": 0.5,
    "wall_over_frameworks": 1.25,
}


def overhead(backend: str, preset: str, rounds: int, *flags: str, label: str | None = None) -> dict:
    cmd = [
        sys.executable,
        "-m",
        f"benchmarks.overhead_{backend}",
        "--spec",
        preset,
        "--rounds",
        str(rounds),
        *flags,
    ]
    # from a warm interpreter where one imported the backend's framework (the suite's), else fresh
    proc = preload_client.run(cmd, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"overhead {backend} {label or preset}: exit {proc.returncode}: "
            f"{proc.stderr.strip()[-300:]}"
        )
    return {**json.loads(lines[-1]), "spec": label or preset}


def twin_overheads(
    refs: list[str], backends: list[str], rounds: int, tmp: Path, console
) -> tuple[list, list]:
    """The step benchmark on user twins: each prepared as compare prepares it (its own torch
    init)."""
    from common.presets import load_spec
    from compare.runs.prepare import INIT_FILE, SPEC_FILE, prepare_start

    results, failures = [], []
    for ref in refs:
        try:
            folder = prepare_start(
                load_spec("", twin=ref), None, sys.executable, sys.executable, 600
            ).folder
        except ValueError as e:
            failures.append(f"twin {ref}: {e}")
            continue
        moved = Path(shutil.move(folder, tmp / f"twin-{len(results)}-{folder.name}"))
        for backend in backends:
            console.print(f"step benchmark: {backend} {ref}", style="dim")
            try:
                results.append(
                    overhead(
                        backend,
                        str(moved / SPEC_FILE),
                        rounds,
                        "--checkpoint",
                        str(moved / INIT_FILE),
                        label=ref.rpartition(":")[2],
                    )
                )
            except RuntimeError as e:
                failures.append(str(e))
    return results, failures


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--presets", default="mlp-tiny,cnn-digits,gpt-tiny", help="comma list; '' for none"
    )
    parser.add_argument(
        "--backends", default="jax,torch_xla,torch,torchax", help="for the step benchmarks"
    )
    parser.add_argument(
        "--twins",
        default="examples/llama/twin.py:llama_tiny",
        help="user twins for the step benchmarks (comma list; '' for none)",
    )
    parser.add_argument(
        "--rounds", type=int, default=30, help="interleaved rounds of the step benchmarks"
    )
    parser.add_argument("--repeats", type=int, default=3, help="repeats of every whole run")
    parser.add_argument("--skip-runs", action="store_true", help="only the step benchmarks")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    presets, console = [p for p in args.presets.split(",") if p], Console()  # '': the twins alone
    if not console.is_terminal:  # piped or logged: do not squeeze the tables to 80 columns
        console = Console(width=180)
    result = {
        "targets": TARGETS,
        "overhead": [],
        "trace_mode_steps": [],
        "runs": {},
        "trace_modes": {},
        "cache": None,
        "imports": None,
        "failures": [],
    }
    for backend in args.backends.split(","):
        for preset in presets:
            console.print(f"step benchmark: {backend} {preset}", style="dim")
            try:
                result["overhead"].append(overhead(backend, preset, args.rounds))
                if backend == "torch_xla":
                    result["trace_mode_steps"].append(
                        overhead(backend, preset, args.rounds, "--trace-modes")
                    )
            except RuntimeError as e:
                result["failures"].append(str(e))
    with tempfile.TemporaryDirectory(prefix="benchmarks-twins-") as tmp:
        found, failures = twin_overheads(
            [t for t in args.twins.split(",") if t],
            args.backends.split(","),
            args.rounds,
            Path(tmp),
            console,
        )
        result["overhead"] += found
        result["failures"] += failures
    if not args.skip_runs:
        with tempfile.TemporaryDirectory(prefix="benchmarks-") as tmp:
            for preset in presets:
                compare_runs, mode_runs, cache_runs = [], {"compile": [], "dynamo": []}, []
                for i in range(args.repeats):
                    console.print(
                        f"whole runs: {preset} repeat {i + 1}/{args.repeats}", style="dim"
                    )
                    try:
                        # cold, then warm on the cache the cold run filled
                        if preset == runs.DEFAULT_PRESET:
                            cache_runs.append(startup.cold_and_warm(Path(tmp) / f"cache-{i}"))
                            compare_runs.append(cache_runs[-1]["cold"])
                        else:
                            compare_runs.append(
                                runs.compare_run(
                                    preset,
                                    Path(tmp) / f"compare-{preset}-{i}",
                                    Path(tmp) / f"cache-{preset}-{i}",
                                )
                            )
                        for mode, collected in mode_runs.items():
                            collected.append(
                                runs.mode_run(preset, mode, Path(tmp) / f"{mode}-{preset}-{i}")
                            )
                    except RuntimeError as e:
                        result["failures"].append(str(e))
                if compare_runs:
                    result["runs"][preset] = runs.summarize_repeats(compare_runs)
                if cache_runs:
                    result["cache"] = runs.summarize_repeats(cache_runs)
                result["trace_modes"][preset] = {
                    m: runs.summarize_repeats(r) for m, r in mode_runs.items() if r
                }
            # `--twin` on jax,torch: one interpreter per side
            for ref in [t for t in args.twins.split(",") if t]:
                twin_runs = []
                for i in range(args.repeats):
                    console.print(
                        f"whole runs: twin {ref} repeat {i + 1}/{args.repeats}", style="dim"
                    )
                    try:
                        twin_runs.append(
                            runs.compare_run(
                                "",
                                Path(tmp) / f"twin-{i}",
                                Path(tmp) / f"cache-twin-{i}",
                                twin=str(REPO / ref),
                            )
                        )
                    except RuntimeError as e:
                        result["failures"].append(str(e))
                if twin_runs:
                    result["runs"][f"twin {ref.rpartition(':')[2]}"] = runs.summarize_repeats(
                        twin_runs
                    )
    try:
        result["imports"] = startup.import_times()
    except RuntimeError as e:
        result["failures"].append(str(e))
    result["checks"] = tables.check_targets(result, TARGETS)
    tables.print_all(result, console)
    out = args.out or REPO / "runs" / f"benchmarks-{time.strftime('%Y%m%d-%H%M%S')}.json"
    write_json_atomic(out, result)
    console.print(f"written: {out}")
    for failure in result["failures"]:
        print(f"error: {failure}", file=sys.stderr)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

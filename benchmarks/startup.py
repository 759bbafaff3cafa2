"""What a repeat run costs: the default `python -m compare --backend both` with an empty compile
cache (cold) and right after, with the cache the cold run filled (warm); and the import time of each
process, split into the toolkit's own modules, the frameworks and everything else (from `python -X
importtime`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from benchmarks.runs import REPO, compare_run
from common import backends

TOOLKIT = {"common", *backends.packages(), "compare", "benchmarks"}
FRAMEWORKS = {"jax", "jaxlib", "flax", "optax", "torch", "torch_xla", "_XLAC", "torchax"}
# What each process imports before its first step: compare itself, and each backend's train module.
PROCESS_IMPORTS = {
    "compare": "compare.__main__",
    "jax": "jax_impl.__main__, jax_impl.train",
    "torch_xla": "torch_xla_impl.__main__, torch_xla_impl.train",
}
LINE = re.compile(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)")


def cold_and_warm(out: Path) -> dict:
    """One cold run on an empty cache, then one warm run on what it left (the default command)."""
    cache = out / "cache"
    cold = compare_run("gpt-tiny", out / "cold", cache)
    warm = compare_run("gpt-tiny", out / "warm", cache)
    return {
        "cold": cold,
        "warm": warm,
        "warm_over_cold": warm["process_wall_s"] / cold["process_wall_s"],
    }


def import_times() -> dict:
    """Seconds of import per process, by owner (self time of every module, summed by top-level
    package)."""
    out = {}
    for process, modules in PROCESS_IMPORTS.items():
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", f"import {modules}"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"import {modules}: {proc.stderr.strip().splitlines()[-1:]}")
        owners = {"toolkit": 0.0, "frameworks": 0.0, "other": 0.0}
        for match in LINE.finditer(proc.stderr):
            top = match.group(2).split(".")[0]
            owner = "toolkit" if top in TOOLKIT else "frameworks" if top in FRAMEWORKS else "other"
            owners[owner] += int(match.group(1)) / 1e6
        out[process] = {**owners, "total": sum(owners.values())}
    return out

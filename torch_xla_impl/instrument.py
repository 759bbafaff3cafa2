"""Compile events, recompile causes and HLO statistics from torch_xla's own tools.

- `torch_xla.debug.metrics`: cleared before the run; after every step the new
  `CompileTime` samples become compile events tagged with phase and step.
  Reading them costs microseconds and only when `UncachedCompile` moved.
- `PT_XLA_DEBUG_LEVEL=1` makes the runtime print a "Compilation Analysis"
  block per compile (and nothing per step). The C++ runtime writes it to file
  descriptor 2, so the run redirects that descriptor into `xla_debug.log`,
  and block k is matched to compile k.
- The optimized HLO comes from XLA's dump flags (`--xla_dump_to`), set before
  torch_xla starts; the largest module dumped is the train step graph.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

from common.hlo import op_histogram, reported_ops
from common.record import CompileEvent

GRAPH_NAME = "SyncTensorsGraph"  # what torch_xla calls every graph a sync cuts
DUMP_DIR = "xla_dump"
DEBUG_LOG = "xla_debug.log"


def configure_debug(run_dir: Path) -> None:
    """Environment for compile causes and HLO dumps; must run before torch_xla is imported."""
    os.environ.setdefault("PT_XLA_DEBUG_LEVEL", "1")
    dump = f"--xla_dump_to={run_dir.resolve() / DUMP_DIR} --xla_dump_hlo_as_text"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {dump}".strip()


class CompileMonitor:
    def __init__(self):
        import torch_xla.debug.metrics as met

        self.met = met
        met.clear_all()
        self.phase, self.step = "setup", -1
        self.events: list[CompileEvent] = []
        self._uncached = 0

    def at(self, phase: str, step: int) -> None:
        self.phase, self.step = phase, step

    def collect(self) -> None:
        """Turn CompileTime samples added since the last call into events (after a sync)."""
        uncached = self.met.counter_value("UncachedCompile") or 0
        if uncached == self._uncached:
            return
        self._uncached = uncached
        data = self.met.metric_data("CompileTime")
        samples = data[2] if data else ()
        for _, nanoseconds in samples[len(self.events):]:
            self.events.append(CompileEvent(GRAPH_NAME, nanoseconds / 1e9, self.step, self.phase))

    def counters(self) -> dict[str, int]:
        return {name: int(self.met.counter_value(name) or 0) for name in ("UncachedCompile", "CachedCompile")}


class NoMonitor:
    """For xmp.spawn replicas other than 0: the metrics are process-wide, replica 0 reads them."""

    events: list = []

    def at(self, phase: str, step: int) -> None:
        pass

    def collect(self) -> None:
        pass

    def counters(self) -> dict[str, int]:
        return {}


@contextlib.contextmanager
def stderr_to(path: Path):
    """Send file descriptor 2 (C++ and Python) to `path`; afterwards replay what was not analysis."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "w") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        others = [ln for ln in path.read_text(errors="replace").splitlines(keepends=True)
                  if "Analysis:" not in ln and not ln.startswith("Computation hash")]
        sys.stderr.write("".join(ln for ln in others if ln.strip()))


def compilation_causes(path: Path) -> list[str]:
    """One line per "Compilation Analysis" block, in compile order."""
    causes, block = [], None
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("Compilation Analysis:"):
            continue
        text = line.removeprefix("Compilation Analysis:").strip()
        if text == "Compilation Cause":
            block = []
        elif block is not None and text.startswith("====") and block:
            causes.append("; ".join(block))
            block = None
        elif block is not None and text and not text.startswith("----") and not text.endswith(":"):
            block.append(text)
    return causes


def hlo_statistics(run_dir: Path, step_graphs: list[int] | None = None) -> dict | None:
    """Op histogram of the train step's optimized HLO, which XLA dumped one module per compile.

    `step_graphs`: the compile ordinals of the graphs a settled step runs (one
    in lazy/compile mode, forward + backward + optimizer under dynamo); their
    modules are concatenated. Without them (or when the dump does not match
    the compile count) the largest module is taken.
    """
    dump = run_dir / DUMP_DIR
    modules = sorted(dump.glob("*after_optimizations.txt"))  # module_NNNN: compile order
    if not modules:
        return None
    if step_graphs and max(step_graphs) < len(modules):
        chosen = [modules[i] for i in step_graphs]
    else:
        chosen = [max(modules, key=lambda p: p.stat().st_size)]
    text = "\n".join(m.read_text() for m in chosen)
    (run_dir / "train_step.hlo.txt").write_text(text)
    shutil.rmtree(dump, ignore_errors=True)
    histogram = op_histogram(text)
    return {"op_histogram": histogram, "reported_ops": reported_ops(histogram), "hlo_file": "train_step.hlo.txt",
            "source": ", ".join(m.name for m in chosen)}

"""Compile events, recompile causes and HLO statistics from torch_xla's own tools.

- `torch_xla.debug.metrics`: cleared before the run; after every step the new
  `CompileTime` samples become compile events tagged with phase and step.
  Reading them costs microseconds and only when `UncachedCompile` moved.
- `PT_XLA_DEBUG_LEVEL=1` makes the runtime print a "Compilation Analysis"
  block per compile (and nothing per step). The C++ runtime writes it to file
  descriptor 2, so the run redirects that descriptor into `xla_debug.log`,
  and block k is matched to compile k.
- The optimized HLO comes from XLA's dump flags (`--xla_dump_to`), set before
  torch_xla starts; the graphs a settled step runs are picked by compile order.
- The persistent compile cache (`torch_xla.runtime.initialize_cache`) is
  watched through its counters (`PersistentCacheHit`, `...Miss`,
  `...DeserializeFailure`): torch_xla 2.9 writes executables but cannot read
  them back on CPU (nor on TPU, pytorch/xla#9094): "Deserializing serialized
  executable not supported". The record says so instead of claiming a cache.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

from analysis.hlo import buffer_assignment_memory, op_histogram, reported_ops
from analysis.recompile import classify_graph_change
from analysis.recompile import entry as recompile_entry
from common.files.fsutil import unusable_cache_dir
from common.files.record import CompileEvent, RunRecord
from common.procs import pid_alive
from common.vocab import Phase, TraceMode

GRAPH_NAME = "SyncTensorsGraph"  # what torch_xla calls every graph a sync cuts
COUNTERS = (
    "UncachedCompile",
    "CachedCompile",
    "PersistentCacheHit",
    "PersistentCacheMiss",
    "PersistentCacheDeserializeFailure",
)
# a graph compiled in this process, or loaded from the persistent cache (CachedCompile: found in
# memory, no compile)
COMPILE_COUNTERS = ("UncachedCompile", "PersistentCacheHit")
DUMP_DIR = "xla_dump"
DEBUG_LOG = "xla_debug.log"


# XLA's dump writes thousands of small files per compile (on CPU every kernel's LLVM IR, MLIR and
# object file: 3,650 files, 40 MB for gpt-tiny). Written to disk they cost a torch_xla run 1.7 s of
# its 15 s (measured, 2.4 s of system CPU); in a memory-backed folder nothing (13.5-13.9 s, as
# without a dump). The run reads a few of them and removes the folder; one left by a killed process
# is removed by the next run.
MEMORY_ROOT = Path("/dev/shm")
# the folder configure_debug chose, for this process and its replicas
DUMP_ENV = "XLA_TWINS_DUMP_DIR"
MEMORY_PREFIX = f"xla-twins-dump-{os.getuid()}-"
# a model whose dump could fill the memory folder dumps beside its run instead
MEMORY_MIN_FREE = 4 << 30


def configure_debug(run_dir: Path, hlo: bool = True) -> None:
    """Environment for compile causes and HLO dumps; must run before torch_xla's runtime starts,
    which reads it (before its import in a fresh interpreter; after it in a child of the suite's
    fork server, tests/preloaded.py)."""
    os.environ.setdefault("PT_XLA_DEBUG_LEVEL", "1")
    os.environ.pop(DUMP_ENV, None)
    if not hlo:
        return
    os.environ[DUMP_ENV] = str(_new_dump_dir(run_dir))
    dump = f"--xla_dump_to={os.environ[DUMP_ENV]} --xla_dump_hlo_as_text"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {dump}".strip()


def _new_dump_dir(run_dir: Path) -> Path:
    """This process's dump folder: in memory where there is room (the stale ones of dead processes
    removed first), else in its run directory."""
    try:
        ours = {
            p: p.name.removeprefix(MEMORY_PREFIX) for p in MEMORY_ROOT.glob(f"{MEMORY_PREFIX}*")
        }
        stale = [p for p, pid in ours.items() if not (pid.isdigit() and pid_alive(int(pid)))]
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        if (
            os.access(MEMORY_ROOT, os.W_OK)
            and shutil.disk_usage(MEMORY_ROOT).free >= MEMORY_MIN_FREE
        ):
            return MEMORY_ROOT / f"{MEMORY_PREFIX}{os.getpid()}"
    except OSError:
        pass
    return run_dir.resolve() / DUMP_DIR


def dump_dir(run_dir: Path) -> Path:
    """The folder XLA dumps this run's HLO into, ours alone to read and remove (never a dump folder
    the user's own XLA_FLAGS name): configure_debug's, which xmp.spawn's replica processes inherit,
    else `run_dir`'s."""
    return Path(os.environ.get(DUMP_ENV) or run_dir / DUMP_DIR)


class CompileMonitor:
    def __init__(self):
        import torch_xla.debug.metrics as met

        self.met = met
        met.clear_all()
        self.phase, self.step = Phase.SETUP, -1
        self.events: list[CompileEvent] = []
        self._uncached = self._hits = self._samples = 0

    def at(self, phase: Phase, step: int) -> None:
        self.phase, self.step = phase, step

    def collect(self) -> None:
        """Turn compiles since the last call (after a sync) into events: CompileTime samples, and
        graphs loaded from the persistent cache (a hit is a compile request too, never hidden)."""
        uncached = self.met.counter_value("UncachedCompile") or 0
        hits = self.met.counter_value("PersistentCacheHit") or 0
        if uncached == self._uncached and hits == self._hits:
            return
        for _ in range(hits - self._hits):  # torch_xla times no load: duration 0
            self.events.append(CompileEvent(GRAPH_NAME, 0.0, self.step, self.phase, cache_hit=True))
        self._uncached, self._hits = uncached, hits
        data = self.met.metric_data("CompileTime")
        samples = data[2] if data else ()
        for _, nanoseconds in samples[self._samples :]:
            self.events.append(CompileEvent(GRAPH_NAME, nanoseconds / 1e9, self.step, self.phase))
        self._samples = len(samples)

    def counters(self) -> dict[str, int]:
        return {name: int(self.met.counter_value(name) or 0) for name in COUNTERS}


class NoMonitor:
    """For xmp.spawn replicas other than 0: the metrics are process-wide, replica 0 reads them."""

    events: list = []

    def at(self, phase: str, step: int) -> None:
        pass

    def collect(self) -> None:
        pass

    def counters(self) -> dict[str, int]:
        return {}


def enable_compile_cache(path: Path | None) -> dict:
    """torch_xla's persistent compile cache in `path` (before any computation). Returns the record's
    `compile_cache` entry; `cache_summary` completes it from the counters."""
    if path is None:
        return {"enabled": False}
    import torch_xla.runtime as xr

    unusable = unusable_cache_dir(path)
    if unusable:
        return unusable
    xr.initialize_cache(str(path), readonly=False)
    return {"enabled": True, "dir": str(path)}


def cache_summary(cache: dict, counters: dict[str, int]) -> dict:
    """Hits, misses and unreadable entries; says plainly when the cache cannot serve this
    runtime."""
    if not cache.get("enabled"):
        return cache
    out = {
        **cache,
        "hits": counters.get("PersistentCacheHit", 0),
        "misses": counters.get("PersistentCacheMiss", 0),
        "unreadable": counters.get("PersistentCacheDeserializeFailure", 0),
    }
    if out["unreadable"]:
        out["note"] = (
            "torch_xla could not load its cached executables (on CPU torch_xla 2.9 logs "
            "'Deserializing "
            "serialized executable not supported'; on TPU see pytorch/xla#9094): every graph "
            "compiled"
        )
    return out


@contextlib.contextmanager
def removed_at_end(dump: Path):
    """The dump folder removed however the run ends (a crash included: the backend then exits
    without its interpreter's shutdown); a folder in memory would otherwise hold its memory until
    the next run."""
    try:
        yield
    finally:
        shutil.rmtree(dump, ignore_errors=True)


@contextlib.contextmanager
def stderr_to(path: Path):
    """Send file descriptor 2 (C++ and Python) to `path`; afterwards replay what was not
    analysis."""
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
        others = [
            ln
            for ln in path.read_text(errors="replace").splitlines(keepends=True)
            if "Analysis:" not in ln and not ln.startswith("Computation hash")
        ]
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


def step_graphs(events: list[CompileEvent], settle_steps: int, trace_mode: TraceMode) -> list[int]:
    """Compile ordinals of the graphs a settled step runs: the last graph compiled while settling
    (lazy, compile); under dynamo every graph of step 0, its last (the optimizer step) replaced by a
    later settling step's when one compiled again (an optimizer whose first step created its
    state)."""
    settling = [i for i, e in enumerate(events) if e.phase == Phase.LOOP and e.step < settle_steps]
    first = [i for i in settling if events[i].step == 0]
    later = [i for i in settling if events[i].step > 0]
    if trace_mode != TraceMode.DYNAMO:
        return settling[-1:]
    return first[:-1] + later if later else first


def attach_causes(record: RunRecord, out_dir: Path, fed: list[tuple]) -> None:
    """Each steady-state recompile, named (analysis.recompile) from the batch fed at its step and
    the one before (`fed`: (shape, dtype) per step) and from its graph against the previous loop
    graph as traced, with torch_xla's Compilation Analysis (cause and Python frame) kept as the
    framework's words."""
    log = out_dir / DEBUG_LOG
    analyses = compilation_causes(log) if log.exists() else []
    # module_NNNN: compile order
    traced = sorted(dump_dir(out_dir).glob("*before_optimizations.txt"))
    # analyses and dumps exist for these only
    compiled = [e for e in record.compile_events if not e.cache_hit]
    graph = lambda k: traced[k].read_text() if k < len(traced) else None  # noqa: E731
    seen = lambda s: fed[s] if 0 <= s < len(fed) else None  # noqa: E731
    previous = None
    for i, event in enumerate(compiled):
        if event.phase != Phase.LOOP:
            continue
        step = event.step
        if step >= record.settle_steps and previous is not None:
            cause, detail = classify_graph_change(
                graph(previous), graph(i), seen(compiled[previous].step), seen(step)
            )
            words = analyses[i] if i < len(analyses) else "no Compilation Analysis captured"
            record.recompile_causes.append(
                recompile_entry(step, event.fun_name, cause, detail, words)
            )
        previous = i


def hlo_statistics(run_dir: Path, graphs: list[int] | None = None) -> dict | None:
    """Op histogram of the train step's optimized HLO, which XLA dumped one module per compile.

    `graphs`: the compile ordinals of the graphs a settled step runs (one
    in lazy/compile mode, forward + backward + optimizer under dynamo); their
    modules are concatenated. Without them (or when the dump does not match
    the compile count) the largest module is taken.
    """
    dump = dump_dir(run_dir)
    modules = sorted(dump.glob("*after_optimizations.txt"))  # module_NNNN: compile order
    if not modules:
        return None
    if graphs and max(graphs) < len(modules):
        chosen = [modules[i] for i in graphs]
    else:
        chosen = [max(modules, key=lambda p: p.stat().st_size)]
    text = "\n".join(m.read_text() for m in chosen)
    (run_dir / "train_step.hlo.txt").write_text(text)
    memory = _memory(chosen)
    shutil.rmtree(dump, ignore_errors=True)
    histogram = op_histogram(text)
    return {
        "op_histogram": histogram,
        "reported_ops": reported_ops(histogram),
        "hlo_file": "train_step.hlo.txt",
        "source": ", ".join(m.name for m in chosen),
        **memory,
    }


def _memory(modules: list[Path]) -> dict:
    """Memory of the step's modules, summed, from the buffer assignment XLA dumps beside each
    one."""
    total: dict[str, int] = {}
    for module in modules:
        assignment = module.with_name(module.name.removesuffix(".txt") + "-buffer-assignment.txt")
        if not assignment.exists():
            return {
                "memory": {},
                "memory_source": f"not available: no buffer assignment beside {module.name}",
            }
        for key, value in buffer_assignment_memory(assignment.read_text()).items():
            total[key] = total.get(key, 0) + (value or 0)
    return {"memory": total, "memory_source": "XLA buffer-assignment dump"}

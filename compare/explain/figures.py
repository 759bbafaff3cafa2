"""Per-backend figures from a run record: compiles, step time, throughput, MFU."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from common.files.fsutil import write_json_atomic
from common.files.record import RunRecord, timed_from
from common.vocab import Phase
from compare.explain.profile import step_breakdown
from compare.explain.program import compiled_program
from compare.runs.cache import cpu_identity

# Peak dense bf16 flop/s per chip (the vendors' figures).
TPU_PEAK_FLOPS = {
    "v4": 2.75e14,
    "v5e": 1.97e14,
    "v5 lite": 1.97e14,
    "v5p": 4.59e14,
    "v6e": 9.2e14,
    "v6 lite": 9.2e14,
}


def compile_summary(record: RunRecord) -> dict:
    """Compile counts by phase; a cache hit counts as a compile (so a recompile stays one) and is
    also counted apart."""
    loop = [e for e in record.compile_events if e.phase == Phase.LOOP]
    return {
        "setup": sum(e.phase == Phase.SETUP for e in record.compile_events),
        "loop": len(loop),
        "steady_state": sum(e.step >= record.settle_steps for e in loop),
        "settle_steps": record.settle_steps,
        "cache_hits": sum(e.cache_hit for e in record.compile_events),
        "compile_s": sum(e.duration_s for e in record.compile_events),
        "causes": record.recompile_causes,
    }


def percentiles(values: list[float]) -> dict | None:
    if not values:
        return None
    arr = np.asarray(values, np.float64)
    return {
        "median": float(np.median(arr)),
        "p10": float(np.percentile(arr, 10)),
        "p90": float(np.percentile(arr, 90)),
        "min": float(arr.min()),
        "max": float(arr.max()),
        "n": len(values),
    }


def step_times(record: RunRecord) -> tuple[dict | None, dict | None]:
    """Synced step ms and (torch_xla) tracing ms, warm-up steps excluded."""
    warm = timed_from(record)
    step_ms = percentiles([s.wall_ms for s in record.steps[warm:]])
    return step_ms, percentiles(record.trace_ms[warm:]) if record.trace_ms else None


def measured_cpu_peak(seconds: float = 0.3) -> float:
    """Best float32 matmul rate numpy reaches on this CPU, in flop/s (labelled 'measured').

    The best of the 1024^3 products that fit in `seconds`, after one that starts
    BLAS's threads: on a shared machine other jobs only ever make a product
    slower, so the maximum is the honest peak. 0.3 s (~30 products here) read
    within 1-2 % of a 1 s measurement (measured: 242-245 vs 244-251 GFLOP/s).
    """
    n = 1024
    a = np.full((n, n), 0.5, np.float32)  # (a product's rate does not depend on the values)
    a @ a
    best, deadline = 0.0, time.perf_counter() + seconds
    while True:  # one product at least: a process paused past a short look's end read 0
        start = time.perf_counter()
        a @ a
        best = max(best, 2 * n**3 / (time.perf_counter() - start))
        if time.perf_counter() >= deadline:
            return best


CPU_PEAK_SOURCE = "measured numpy float32 matmul peak of this CPU"
CPU_PEAK_FILE = "cpu_peak.json"
# a run's look at the peak beside a cached one: the warm-up and products for 0.02 s, two or three
# (~11 ms each on the developers' machines): 0.04 s of a run's wall (0.08 s at 0.05 s)
LOOK_S = 0.02


def cpu_peak(cache_dir: Path | None) -> tuple[float, str]:
    """The measured CPU peak and where it comes from. With a cache directory, a peak measured
    earlier on this same machine (host, CPU, core count, numpy) is reused and says when it was
    measured (the full measurement takes 0.3 s); a 0.02 s look each run (Evidence looks once a run)
    replaces it with what it reads when that is more: the peak only rises, so a short look costs
    at most a run's MFU being read against a peak a later run raises."""
    path = cache_dir / CPU_PEAK_FILE if cache_dir else None
    identity, flops = cpu_identity(), 0.0
    if path is not None and (path.exists() or path.is_symlink()) and not path.is_file():
        # a FIFO would hang the read, a folder fail it: neither is read, nor replaced
        print(
            f"warning: {path} is not a regular file; the CPU peak is measured afresh and not "
            "cached (remove it to cache the peak again)",
            file=sys.stderr,
        )
        path = None
    if path is not None and path.exists():
        try:
            cached = json.loads(path.read_text())
            if cached.get("identity") == identity and float(cached["flops"]) > 0:
                # a short look each run: a peak measured while the machine
                # was busy is raised, never kept
                flops = measured_cpu_peak(LOOK_S)
                if flops <= float(cached["flops"]):
                    return float(
                        cached["flops"]
                    ), f"{CPU_PEAK_SOURCE} (cached, measured {cached['measured_at']})"
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable: measure again and replace it
    # a look that read more than the cached peak stands: peaks only rise
    flops = flops or measured_cpu_peak()
    if path is not None:
        try:
            write_json_atomic(
                path,
                {
                    "identity": identity,
                    "flops": flops,
                    "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
            )
        except OSError:
            pass  # an unwritable cache costs the next run 0.3 s, nothing else
    return flops, CPU_PEAK_SOURCE


def peak_flops(record: RunRecord, cpu_peak) -> tuple[float | None, str]:
    kind = str(record.platform.get("device_kind", "")).lower()
    platform = str(record.platform.get("device_platform", "")).lower()
    if "tpu" in kind or "tpu" in platform:
        for name, peak in TPU_PEAK_FLOPS.items():
            if name in kind:
                return (
                    peak,
                    f"TPU {name} bf16 peak per chip x {record.platform.get('device_count', 1)}",
                )
        return None, f"unknown TPU kind {kind!r}"
    if platform == "cpu" or kind == "cpu":
        return cpu_peak()
    return None, f"no peak known for {kind or platform!r}"


def wall_breakdown(
    record: RunRecord,
    started_at: float | None,
    wall_s: float | None,
    described_at: float | None = None,
) -> dict | None:
    """Where a backend process's wall time went: start + imports, compile, steps, everything else.

    From the launch time compare took and the epoch marks the backend recorded
    (`ready` after imports, `loop_start`, `loop_end` after the pipelined
    steps); compile time is the sum of the compile events, and is taken out
    of the loop so that the four parts add up to the process's wall time.
    A run handed to its describe step's process (`described_at`: that process's
    launch) paid its interpreter start and imports there: `described_s` says how
    long that process had run, describing and waiting included, when handed it.
    """
    timeline = record.timeline
    if not timeline or started_at is None or not wall_s:
        return None
    compile_s = sum(e.duration_s for e in record.compile_events)
    loop_compile_s = sum(e.duration_s for e in record.compile_events if e.phase == Phase.LOOP)
    start_s = timeline["ready"] - started_at
    steps_s = timeline["loop_end"] - timeline["loop_start"] - loop_compile_s
    return {
        "start_and_imports_s": start_s,
        "compile_s": compile_s,
        "steps_s": steps_s,
        "other_s": wall_s - start_s - compile_s - steps_s,
        "total_s": wall_s,
        **({"described_s": started_at - described_at} if described_at else {}),
    }


def backend_summary(record: RunRecord, record_dir: Path, cpu_peak) -> dict:
    step_ms, trace_ms = step_times(record)
    # reads the step's HLO once, matmul flops included
    program = compiled_program(record, record_dir)
    # dot + convolution flops of the optimized HLO (the same count for every XLA runtime); a runtime
    # without HLO (eager torch) counts its own
    flops = (program["matmul_flops"] or None) if program["available"] else record.flops_per_step
    peak, peak_source = peak_flops(record, cpu_peak)
    devices = int(record.platform.get("device_count", 1))
    if peak and "TPU" in peak_source:
        peak *= devices
    mfu = (
        flops / (step_ms["median"] / 1e3) / peak
        if flops and peak and step_ms and step_ms["median"] > 0
        else None
    )
    # say it, rather than print 180 % as a fact
    if mfu is not None and mfu > 1 and "measured" in peak_source:
        peak_source += (
            " (below this run's own rate: the machine was busy when the peak was measured)"
        )
    return {
        "status": record.status,
        "message": record.message,
        "compiles": compile_summary(record),
        "step_ms": step_ms,
        "trace_ms": trace_ms,
        "throughput": record.throughput,
        "flops_per_step": flops,
        "cost_analysis_flops": (record.hlo_stats or {}).get("flops"),
        "peak_flops": peak,
        "peak_source": peak_source,
        "mfu": mfu,
        "peak_rss_mb": record.peak_rss_mb,
        "trace_mode": record.trace_mode,
        "compile_cache": record.compile_cache,
        "hlo_ops": (record.hlo_stats or {}).get("reported_ops"),
        "hlo": program,
        "profile": step_breakdown(record_dir, record.profile, (step_ms or {}).get("median")),
        "losses": record.losses,
        "step_ms_all": [s.wall_ms for s in record.steps[timed_from(record) :]],
        "versions": record.versions,
        "platform": record.platform,
        "numerics": {k: v for k, v in record.numerics.items() if k != "env"},
        "extra": record.extra.to_dict(),
    }

"""Where a profiled step goes: device time and host time per step, from a backend's `--profile`
trace.

The trace (XSpace, read by compare/explain/xplane.py) holds our annotations
(common.vocab.ProfileRange) on the host's Python thread and the device's
work: on a GPU or TPU the `/device:*` planes (their "XLA Ops" line when
there is one); on the CPU, the XLA ops that the runtime's own threads
(`tf_XLA*` lines) run, by HLO instruction name (the runtime's bookkeeping
events, named `Class::method` or `end: ...`, are not device work). Per step:
  device  = the time at least one device op ran inside the step,
  host    = the rest of the step (the device idle: tracing, dispatch, Python),
so device + host is the step as the profiler saw it; `vs_synced_step` sets
that against the same number of synced steps timed just before without the
profiler (`vs_loop_step`: against the loop's median, which the machine's
drift between the two phases moves too).
The host annotations split the step: `call` (the framework call: tracing
and dispatch), `wait` (for the device), and `input` before the step.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from common.vocab import ProfileRange

if TYPE_CHECKING:
    from compare.explain.xplane import Event

_WRAPPER = re.compile(r"^(call|while|conditional)(\.\d+)?$")  # XLA:CPU ops that only run other ops


def _is_device_op(event: Event, device_lines: set[tuple[str, str]] | None) -> bool:
    if device_lines is not None:
        return (event.plane, event.line) in device_lines
    return (
        event.line.startswith("tf_XLA")
        and "::" not in event.name
        and not event.name.startswith("end: ")
        and not _WRAPPER.match(event.name)
    )


def _device_lines(events: list[Event]) -> set[tuple[str, str]] | None:
    """The device planes' op lines, or None on a CPU (no `/device:` plane)."""
    lines = {(e.plane, e.line) for e in events if e.plane.startswith("/device:")}
    if not lines:
        return None
    ops = {(p, ln) for p, ln in lines if ln == "XLA Ops"}
    return ops or lines


def _busy_ns(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of `intervals` clipped to [lo, hi]."""
    total, end = 0.0, lo
    for start, stop in sorted(intervals):
        start, stop = max(start, end), min(stop, hi)
        if stop > start:
            total += stop - start
            end = stop
    return total


def trace_file(run_dir: Path, profile: dict) -> Path | None:
    found = sorted((run_dir / profile.get("dir", "profile")).glob("**/*.xplane.pb"))
    return found[-1] if found else None


def step_breakdown(
    run_dir: Path, profile: dict | None, synced_median_ms: float | None
) -> dict | None:
    """report.json's `backends.<name>.profile`: the median profiled step and its parts, in ms."""
    if not profile or not profile.get("steps"):
        return (
            {"available": False, "why": profile["why"]} if profile and profile.get("why") else None
        )
    path = trace_file(run_dir, profile)
    if path is None:
        return {
            "available": False,
            "why": f"no *.xplane.pb under {run_dir / profile.get('dir', 'profile')}",
        }
    # here: protobuf's import is a run's with --profile only
    from compare.explain.xplane import TraceError, read_events

    try:
        events = read_events(path)
    except TraceError as e:
        return {"available": False, "why": str(e)}
    host = [e for e in events if e.name in set(ProfileRange)]
    steps = sorted((e for e in host if e.name == ProfileRange.STEP), key=lambda e: e.start_ns)
    device_lines = _device_lines(events)
    device = [e for e in events if _is_device_op(e, device_lines)]
    busy_intervals = sorted((e.start_ns, e.end_ns) for e in device)  # once, for every step
    per_step: dict[str, list[float]] = defaultdict(list)
    op_time: dict[str, float] = defaultdict(float)
    for i, s in enumerate(steps):
        busy = _busy_ns(busy_intervals, s.start_ns, s.end_ns)
        per_step["step"].append(s.duration_ns / 1e6)
        per_step["device"].append(busy / 1e6)
        per_step["host"].append((s.duration_ns - busy) / 1e6)
        for name in (ProfileRange.CALL, ProfileRange.WAIT):
            per_step[name.value.split()[-1]].append(
                sum(
                    e.duration_ns
                    for e in host
                    if e.name == name and s.start_ns <= e.start_ns < s.end_ns
                )
                / 1e6
            )
        previous_end = steps[i - 1].end_ns if i else float("-inf")
        per_step["input"].append(
            sum(
                e.duration_ns
                for e in host
                if e.name == ProfileRange.INPUT and previous_end <= e.start_ns < s.start_ns
            )
            / 1e6
        )
        for e in device:
            if s.start_ns <= e.start_ns < s.end_ns:
                op_time[e.name] += e.duration_ns / 1e6
    if not steps:
        return {"available": False, "why": f"{path.name} holds no '{ProfileRange.STEP}' annotation"}
    # the breakdown of the median step (by its length), so that its parts add up to it
    middle = sorted(range(len(steps)), key=lambda i: per_step["step"][i])[(len(steps) - 1) // 2]
    median = {k: v[middle] for k, v in per_step.items()}
    unprofiled = (
        statistics.median(profile["unprofiled_step_ms"])
        if profile.get("unprofiled_step_ms")
        else None
    )
    top = sorted(op_time.items(), key=lambda kv: -kv[1])[:5]
    return {
        "available": True,
        "trace": str(path.relative_to(run_dir.parent)),
        "tool": profile.get("tool"),
        "steps": len(steps),
        "median_ms": median,
        "our_clock_median_ms": statistics.median(profile["step_ms"])
        if profile.get("step_ms")
        else None,
        "loop_step_median_ms": synced_median_ms,
        "vs_loop_step": median["step"] / synced_median_ms if synced_median_ms else None,
        "unprofiled_step_median_ms": unprofiled,
        "vs_synced_step": median["step"] / unprofiled if unprofiled else None,
        "device_source": "device planes"
        if device_lines
        else "XLA:CPU ops on the runtime's threads",
        "top_device_ops_ms_per_step": [[name, t / len(steps)] for name, t in top],
    }

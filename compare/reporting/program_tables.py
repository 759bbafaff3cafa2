"""The tables of what each backend compiled and where its step goes (`--profile`), from
report.json's backends."""

from __future__ import annotations

from compare.explain.program import metric_rows
from compare.reporting.cells import fmt as _fmt


def program_tables(backends: dict, apart: str = "") -> list[tuple[str, list[str], list[list[str]]]]:
    """The compiled steps side by side, most different metric first, and what each backend lacks."""
    programs = {n: b["hlo"] for n, b in backends.items() if (b.get("hlo") or {}).get("available")}
    if not programs:
        return []
    names = list(programs)
    out = [
        (
            "Compiled step, per settled step (most different first)" + apart,
            ["", *names],
            [
                [row[0]]
                + [
                    _fmt(float(v), ",.0f") if isinstance(v, (int, float)) else _fmt(v)
                    for v in row[1:]
                ]
                for row in metric_rows(programs)
            ],
        )
    ]
    gaps = [
        [n, what, why]
        for n, b in backends.items()
        for what, why in ((b.get("hlo") or {}).get("not_available") or {}).items()
    ]
    gaps += [
        [n, "compiled program", b["hlo"]["why"]]
        for n, b in backends.items()
        if b.get("hlo") and not b["hlo"].get("available")
    ]
    if gaps:
        out.append(("Not available, and why", ["backend", "number", "why"], gaps))
    return out


def profile_tables(backends: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """--profile: where a step goes, per backend, from its trace."""
    prof = {
        n: b["profile"] for n, b in backends.items() if (b.get("profile") or {}).get("available")
    }
    if not prof:
        return []
    names = list(prof)
    ms = lambda n, k: _fmt(prof[n]["median_ms"].get(k), ".3f")  # noqa: E731
    rows = [
        ["profiled steps"] + [str(prof[n]["steps"]) for n in names],
        ["step in the trace (ms, median)"] + [ms(n, "step") for n in names],
        ["  device busy (ms)"] + [ms(n, "device") for n in names],
        ["  host only, device idle (ms)"] + [ms(n, "host") for n in names],
        ["  framework call: tracing + dispatch (ms)"] + [ms(n, "call") for n in names],
        ["  waiting for the device (ms)"] + [ms(n, "wait") for n in names],
        ["input before the step (ms)"] + [ms(n, "input") for n in names],
        ["trace step / synced step without the profiler"]
        + [_fmt(prof[n]["vs_synced_step"], ".3f") for n in names],
        ["busiest device ops (ms/step)"]
        + [
            "; ".join(f"{op} {t:.3f}" for op, t in prof[n]["top_device_ops_ms_per_step"][:3])
            for n in names
        ],
        ["trace (opens in xprof / TensorBoard)"] + [prof[n]["trace"] for n in names],
    ]
    return [("Where the step goes (--profile)", ["", *names], rows)]

"""The benchmark's terminal tables and target checks (rich; the JSON holds the same numbers)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from benchmarks.runs import DEFAULT_PRESET


def _m(value, spec: str = ".3f") -> str:
    """A spread as 'median [min-max]', a number as itself, a missing value as '-'."""
    if value is None:
        return "-"
    if isinstance(value, dict):
        return f"{value['median']:{spec}} [{value['min']:{spec}}-{value['max']:{spec}}]"
    return format(value, spec) if isinstance(value, float) else str(value)


def _med(value):
    return value["median"] if isinstance(value, dict) else value


def _table(title: str, header: list[str], rows: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for h in header:
        table.add_column(h)
    for row in rows:
        table.add_row(*row)
    return table


def check_targets(result: dict, targets: dict) -> list[dict]:
    checks = []
    for r in result["overhead"]:
        for key in ("toolkit_over_minimal", "instrumented_over_uninstrumented"):
            value = r["ratios"][key]["median"]
            checks.append(
                {
                    "what": f"{r['backend']} {r['spec']} {key}",
                    "value": value,
                    "target": f"<= {targets[key]}",
                    "met": value <= targets[key],
                }
            )
    for preset, run in result["runs"].items():
        for backend, b in run["backends"].items():
            value = _med(b["steady_state_recompiles"])
            checks.append(
                {
                    "what": f"{backend} {preset} steady-state recompiles",
                    "value": value,
                    "target": "== 0",
                    "met": value == 0,
                }
            )
    for preset, modes in result["trace_modes"].items():
        for mode, m in modes.items():
            value = _med(m["steady_state_recompiles"])
            checks.append(
                {
                    "what": f"torch_xla {preset} --trace-mode {mode} steady-state recompiles",
                    "value": value,
                    "target": "== 0",
                    "met": value == 0,
                }
            )
    if result.get("cache"):
        value = result["cache"]["warm_over_cold"]["median"]
        checks.append(
            {
                "what": "default compare, warm / cold compile cache (wall time)",
                "value": value,
                "target": f"<= {targets['warm_over_cold']}",
                "met": value <= targets["warm_over_cold"],
            }
        )
    for name, run in result["runs"].items():
        if name.startswith("twin "):
            value = _med(run["wall_over_frameworks"])
            checks.append(
                {
                    "what": f"`--twin` compare of {name[5:]}, cold: wall time / the frameworks' "
                    "own (imports, "
                    "compiles, steps, the sides' describing)",
                    "value": value,
                    "target": f"<= {targets['wall_over_frameworks']}",
                    "met": value is not None and value <= targets["wall_over_frameworks"],
                }
            )
    default = result["runs"].get(DEFAULT_PRESET)
    if default:
        value = default["process_wall_s"]["max"]
        checks.append(
            {
                "what": "default `python -m compare --backend both` wall time (s, slowest repeat)",
                "value": value,
                "target": f"<= {targets['default_compare_wall_s']}",
                "met": value <= targets["default_compare_wall_s"],
            }
        )
        value = _med(default["wall_over_frameworks"])
        checks.append(
            {
                "what": "default compare, cold: wall time / the frameworks' own (imports, "
                "compiles, steps)",
                "value": value,
                "target": f"<= {targets['wall_over_frameworks']}",
                "met": value is not None and value <= targets["wall_over_frameworks"],
            }
        )
    return checks


def print_all(result: dict, console: Console) -> None:
    rows = []
    for r in result["overhead"]:
        ms, ratios = r["step_ms"], r["ratios"]
        delta_us = (ms["toolkit"]["median"] - ms["uninstrumented"]["median"]) * 1e3
        rows.append(
            [
                r["backend"],
                r["spec"],
                _m(ms["minimal"]),
                _m(ms["toolkit"]),
                _m(ratios["toolkit_over_minimal"]),
                _m(ms["uninstrumented"]),
                _m(ratios["instrumented_over_uninstrumented"]),
                f"{delta_us:+.1f}",
            ]
        )
    console.print(
        _table(
            "Train step, interleaved side by side: ms per synced step, median of rounds [min-max]",
            [
                "backend",
                "preset",
                "minimal loop",
                "toolkit",
                "toolkit/minimal",
                "uninstrumented",
                "instrumented/uninstr.",
                "instr. cost us",
            ],
            rows,
        )
    )

    rows = []
    for r in result["trace_mode_steps"]:
        ms, tr, ratios = r["step_ms"], r["tracing_ms"], r["ratios"]
        modes = result["trace_modes"].get(r["spec"], {})
        lazy_run = result["runs"].get(r["spec"], {}).get("backends", {}).get("torch_xla", {})
        compile_s = [_m(lazy_run.get("compile_s"), ".2f")] + [
            _m(modes.get(m, {}).get("compile_s"), ".2f") for m in ("compile", "dynamo")
        ]
        rows.append(
            [
                r["spec"],
                _m(ms["lazy"]),
                _m(ms["compile"]),
                _m(ms["dynamo"]),
                _m(ratios["compile_over_lazy"]),
                _m(ratios["dynamo_over_lazy"]),
                " / ".join(f"{tr[m]['share_of_step']:.0%}" for m in ("lazy", "compile", "dynamo")),
                " / ".join(compile_s),
            ]
        )
    if rows:
        console.print(
            _table(
                "torch_xla trace modes (toolkit step, interleaved; lazy is the default)",
                [
                    "preset",
                    "lazy ms",
                    "compile ms",
                    "dynamo ms",
                    "compile/lazy",
                    "dynamo/lazy",
                    "tracing share l/c/d",
                    "compile s l/c/d",
                ],
                rows,
            )
        )

    rows = []
    for preset, run in result["runs"].items():
        for backend, b in run["backends"].items():
            pipelined = _med(b["pipelined_ms"]) / _med(b["step_ms"])
            rows.append(
                [
                    preset,
                    backend,
                    _m(b["step_ms"]),
                    _m(b["pipelined_ms"]),
                    f"{pipelined:.2f}",
                    _m(b["compile_s"], ".2f"),
                    _m(b["steady_state_recompiles"], ".0f"),
                    _m(b["mfu"], ".1%"),
                    _m(b["peak_rss_mb"], ".0f"),
                ]
            )
    if rows:
        console.print(
            _table(
                "Whole runs of `python -m compare --backend both`: median of repeats [min-max]",
                [
                    "preset",
                    "backend",
                    "synced ms/step",
                    "pipelined ms/step",
                    "pipelined/synced",
                    "compile s",
                    "steady recompiles",
                    "MFU (measured CPU peak)",
                    "peak RSS MiB",
                ],
                rows,
            )
        )

    default = result["runs"].get(DEFAULT_PRESET)
    if default:
        wall, b = default["wall_time"], default["backends"]
        rows = [
            ["whole process (measured outside)", _m(default["process_wall_s"], ".2f")],
            [
                "compare: interpreter start",
                _m(_minus(default["process_wall_s"], wall["total_s"]), ".2f"),
            ],
            ["compare: imports", _m(wall["compare_imports_s"], ".2f")],
            ["compare: arguments, checks, preparation", _m(wall["prepare_s"], ".2f")],
        ]
        for name in b:
            for key, label in (
                ("start_and_imports_s", "interpreter start + imports"),
                ("compile_s", "compile"),
                ("steps_s", "steps (synced + pipelined)"),
                ("other_s", "other (init, parity tensors, HLO, record)"),
            ):
                rows.append([f"{name}: {label}", _m(b[name].get(f"wall_{key}"), ".2f")])
        rows.append(["report (parity, plots, files)", _m(wall["report_s"], ".2f")])
        rows.append(
            [
                "whole / the frameworks' own (imports, compiles, steps)",
                _m(default["wall_over_frameworks"], ".3f"),
            ]
        )
        console.print(
            _table(
                "Default `python -m compare --backend both` wall time, s (median [min-max])",
                ["part", "seconds"],
                rows,
            )
        )

    print_startup(result, console)
    console.print(
        _table(
            "Targets",
            ["figure", "value", "target", ""],
            [
                [
                    c["what"],
                    _m(c["value"], ".3f") if isinstance(c["value"], float) else str(c["value"]),
                    c["target"],
                    "met" if c["met"] else "MISSED",
                ]
                for c in result["checks"]
            ],
        )
    )


def print_startup(result: dict, console: Console) -> None:
    """Cold vs warm compile cache (the default command), and import time by owner."""
    cache = result.get("cache")
    if cache:
        own = ("compare_imports_s", "prepare_s", "report_s")
        rows = [
            [
                "whole process (measured outside)",
                _m(cache["cold"]["process_wall_s"], ".2f"),
                _m(cache["warm"]["process_wall_s"], ".2f"),
            ],
            [
                "compare: imports, preparation, report",
                _m(_plus(cache["cold"]["wall_time"], *own), ".2f"),
                _m(_plus(cache["warm"]["wall_time"], *own), ".2f"),
            ],
        ]
        for name in cache["cold"]["backends"]:
            cold, warm = cache["cold"]["backends"][name], cache["warm"]["backends"][name]
            for key, label in (
                ("wall_total_s", "process"),
                ("wall_start_and_imports_s", "start + imports"),
                ("wall_compile_s", "compile"),
                ("wall_steps_s", "steps"),
                ("wall_other_s", "other"),
            ):
                rows.append(
                    [f"{name}: {label}", _m(cold.get(key), ".2f"), _m(warm.get(key), ".2f")]
                )
            rows.append(
                [
                    f"{name}: compiles served by the cache",
                    _m(cold["cache_hits"], ".0f"),
                    _m(warm["cache_hits"], ".0f"),
                ]
            )
        rows.append(["warm / cold (whole process)", "", _m(cache["warm_over_cold"], ".3f")])
        console.print(
            _table(
                "Default `python -m compare --backend both`: empty compile cache (cold) vs the "
                "cache a cold run filled (warm), s, median [min-max]",
                ["part", "cold", "warm"],
                rows,
            )
        )
    if result.get("imports"):
        rows = [
            [
                p,
                f"{t['toolkit']:.3f}",
                f"{t['frameworks']:.3f}",
                f"{t['other']:.3f}",
                f"{t['total']:.3f}",
            ]
            for p, t in result["imports"].items()
        ]
        console.print(
            _table(
                "Import time per process (s, self time by owner, python -X importtime)",
                ["process", "toolkit", "frameworks", "other", "total"],
                rows,
            )
        )


def _plus(wall: dict, *keys: str) -> float:
    return sum(_med(wall[k]) for k in keys)


def _minus(a: dict, b: dict) -> float:
    return _med(a) - _med(b)

"""The compiled train step of each backend, summarised, and the rows that set programs side by side.

report.json's `backends.<name>.hlo` is `compiled_program`; report.md's "Compiled step" table and
`python -m compare.hlo` both use `metric_rows`, which puts the metrics that differ most first.
"""

from __future__ import annotations

from pathlib import Path

from analysis.hlo import matmul_flops, op_histogram, parse_modules, program_summary
from common import backends
from common.files.record import RunRecord

NOT_COMPILED = "eager: runs op by op, no compiled program"


def program_of_text(text: str) -> dict:
    modules = parse_modules(text)  # once for the three readings
    return {
        **program_summary(modules),
        "matmul_flops": matmul_flops(modules),
        "op_histogram": op_histogram(modules),
    }


def compiled_program(record: RunRecord, record_dir: Path) -> dict:
    """Summary of the HLO the backend saved, with the flops, bytes and memory its framework
    measured; every number that is not available says why instead of a guess."""
    stats = record.hlo_stats or {}
    path = record_dir / stats["hlo_file"] if stats.get("hlo_file") else None
    if path is None or not path.exists():
        return {
            "available": False,
            "why": NOT_COMPILED
            if not _compiles(record.backend)
            else "no HLO file recorded (run with --no-hlo, or it did not finish)",
        }
    out = {
        "available": True,
        "hlo_file": str(path.relative_to(record_dir.parent))
        if record_dir.parent in path.parents
        else str(path),
        **program_of_text(path.read_text()),
    }
    missing = {}
    out["cost_analysis_flops"] = stats.get("flops")
    out["bytes_accessed"] = stats.get("bytes_accessed")
    if out["bytes_accessed"] is None:
        missing["bytes_accessed"] = "XLA's cost analysis is not exposed by this runtime"
    memory = dict(stats.get("memory") or {})
    if memory:
        memory["peak_bytes"] = peak_bytes(memory)
    else:
        missing["memory"] = stats.get("memory_source") or "no memory analysis recorded"
    out.update(memory=memory, memory_source=stats.get("memory_source"), not_available=missing)
    return out


def _compiles(name: str) -> bool:
    return name not in backends.registry() or backends.info(name).compiles


def peak_bytes(memory: dict) -> int | None:
    """Bytes live at once: XLA's own total when it reports one, else arguments + outputs +
    temporaries less what outputs alias from arguments (donated buffers are counted once)."""
    if memory.get("total_bytes_used"):
        return int(memory["total_bytes_used"])
    parts = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
    if not all(k in memory for k in parts):
        return None
    return int(sum(memory[k] for k in parts) - memory.get("alias_size_in_bytes", 0))


def flat_metrics(program: dict) -> dict[str, float | None]:
    """The comparable numbers of one program summary, one name each."""
    if not program or not program.get("available", True):
        return {}
    out = {"kernels per step": program["kernels"]}
    out.update({f"fusions {kind}": n for kind, n in program["fusions"].items()})
    out.update(
        {
            "dot (all)": program["dot"],
            "convolution (all)": program["convolution"],
            "dot/convolution outside fusions": program["unfused_dot_or_convolution"],
            "element-wise outside fusions": program["unfused_elementwise"],
            "copies": program["copies"],
            "transposes": program["transposes"],
            "RNG ops": program["rng"],
        }
    )
    for op, c in program["collectives"].items():
        out[f"{op} count"], out[f"{op} bytes"] = c["count"], c["bytes"]
    out.update({f"custom-call {t}": n for t, n in program["custom_calls"].items()})
    out["matmul flops"] = program.get("matmul_flops")
    out["bytes accessed (cost analysis)"] = program.get("bytes_accessed")
    memory = program.get("memory") or {}
    for key, label in (
        ("argument_size_in_bytes", "memory: arguments (B)"),
        ("output_size_in_bytes", "memory: outputs (B)"),
        ("temp_size_in_bytes", "memory: temporaries (B)"),
        ("peak_bytes", "memory: peak (B)"),
    ):
        if key in memory:
            out[label] = memory[key]
    return out


def _spread(values: list) -> float:
    """How much a metric differs across programs: max/min (a metric one side lacks counts as
    most)."""
    present = [v for v in values if v is not None]
    if len(present) < len(values):
        return float("inf")
    lo, hi = min(present), max(present)
    if hi == lo:
        return 1.0
    return float("inf") if lo <= 0 else hi / lo


def metric_rows(programs: dict[str, dict]) -> list[list]:
    """[metric, value per program...] for every metric any program has, most different first."""
    metrics = {name: flat_metrics(p) for name, p in programs.items()}
    keys = list(dict.fromkeys(k for m in metrics.values() for k in m))
    rows = [[k] + [metrics[n].get(k) for n in programs] for k in keys]
    rows = [r for r in rows if any(v is not None for v in r[1:])]
    return sorted(rows, key=lambda r: -_spread(r[1:]))


def one_sided_ops(a: dict, b: dict) -> tuple[list[str], list[str]]:
    """Opcodes (and fusion kinds) present in one program only."""
    ops_a = set(a.get("op_histogram", {})) | {f"fusion {k}" for k in a.get("fusions", {})}
    ops_b = set(b.get("op_histogram", {})) | {f"fusion {k}" for k in b.get("fusions", {})}
    return sorted(ops_a - ops_b), sorted(ops_b - ops_a)

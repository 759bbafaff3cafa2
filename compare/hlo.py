"""`python -m compare.hlo A B`: a structural diff of two compiled train steps.

A and B are each an optimized-HLO text file, a backend run directory (its
record names the HLO file) or a compare run directory (`--backend` picks
which of its backends; default its reference). Printed: every metric of the
two programs (kernels, fusions by kind, dots, copies, collectives with
bytes, custom calls, flops, memory), most different first; the opcodes
present on one side only; the largest buffers of each.

What we chose: the input is the optimized HLO text XLA writes (JAX's
`compiled.as_text()`, torch_xla's `--xla_dump_to` dump): the program that
really runs. XLA's own comparison tool (hlo-diff) is not shipped in the
jaxlib or torch_xla wheels, so the diff is over the counts of
`analysis.hlo`, which report.md uses too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table

from common.cli import Parser, fail
from common.files.fsutil import require_regular_file
from common.files.record import RECORD_FILE, RecordError, read_record
from common.vocab import ExitCode
from compare.explain.program import compiled_program, metric_rows, one_sided_ops, program_of_text


def hlo_text(path: Path) -> str:
    """The text of an optimized-HLO file (its first line `HloModule ...`); ValueError when it is not
    one."""
    require_regular_file(path, "", ValueError)  # a FIFO would block the read forever
    not_hlo = ValueError(
        f"{path} is not HLO text (no HloModule header); give an optimized HLO dump or a run "
        "directory"
    )
    with open(path, "rb") as f:
        head = f.read(4096).lstrip()
    if not head.startswith(b"HloModule "):
        raise not_hlo
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise not_hlo from None


def program_at(path: Path, backend: str | None) -> tuple[Path, dict]:
    """(HLO file, program summary) of a file, a backend run dir (memory and cost analysis from its
    record too) or a compare run dir; raises ValueError."""
    require_regular_file(path, "", ValueError, directory_ok=True)
    if path.is_file():
        return path, program_of_text(hlo_text(path))
    if not path.is_dir():
        raise ValueError(
            f"{path}: no such file or directory (give an HLO text file or a run directory)"
        )
    report = path / "report.json"
    if not (path / RECORD_FILE).exists() and report.exists():
        try:
            data = json.loads(
                require_regular_file(report, "compare report", ValueError).read_text()
            )
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(
                f"compare report {report} is not valid JSON (truncated or corrupt): {e}"
            ) from None
        if not isinstance(data, dict):
            raise ValueError(f"compare report {report} is not a JSON object (truncated or corrupt)")
        name = backend or data.get("reference")
        if name not in data.get("backend_names", []):
            raise ValueError(
                f"{path} has no backend {name!r} (it ran "
                f"{', '.join(data.get('backend_names', []))}); "
                "pick one with --backend"
            )
        path = path / name
    try:
        record = read_record(path / RECORD_FILE)
    except RecordError as e:
        raise ValueError(str(e)) from None
    hlo_file = (record.hlo_stats or {}).get("hlo_file")
    if hlo_file and os.path.lexists(path / hlo_file):
        hlo_text(path / hlo_file)  # a FIFO, or a file that is not HLO, is one line here
    program = compiled_program(record, path)
    if not program["available"]:
        raise ValueError(f"{path} ({record.backend}) has no compiled program: {program['why']}")
    return path / record.hlo_stats["hlo_file"], program


def _num(value) -> str:
    return "-" if value is None else f"{value:,.0f}"


def print_diff(a: tuple[Path, dict], b: tuple[Path, dict], console: Console) -> dict:
    (a, pa), (b, pb) = a, b
    table = Table(title=f"A: {a}\nB: {b}", title_justify="left")
    for column in ("metric (per step)", "A", "B", "B - A"):
        table.add_column(column, justify="left" if column.startswith("metric") else "right")
    rows = metric_rows({"A": pa, "B": pb})
    for name, va, vb in rows:
        delta = vb - va if va is not None and vb is not None else None
        style = None if va == vb else "bold"
        table.add_row(
            name,
            _num(va),
            _num(vb),
            _num(delta) if delta is None or delta <= 0 else f"+{delta:,.0f}",
            style=style,
        )
    console.print(table)
    only_a, only_b = one_sided_ops(pa, pb)
    console.print(f"ops only in A: {', '.join(only_a) or 'none'}")
    console.print(f"ops only in B: {', '.join(only_b) or 'none'}")
    for label, program in (("A", pa), ("B", pb)):
        largest = "; ".join(
            f"{x['name']} {x['shape'][:60]} {x['bytes']:,} B"
            for x in program["largest_buffers"][:3]
        )
        console.print(f"largest buffers in {label}: {largest or 'none'}")
    return {"rows": rows, "only_in_a": only_a, "only_in_b": only_b}


def main(argv=None) -> int:
    parser = Parser(prog="python -m compare.hlo", description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="HLO text file, backend run dir or compare run dir")
    parser.add_argument("b", type=Path, help="the same kinds as A")
    parser.add_argument(
        "--backend", help="which backend of a compare run dir (default: its reference)"
    )
    args = parser.parse_args(argv)
    try:
        a, b = program_at(args.a, args.backend), program_at(args.b, args.backend)
    except (ValueError, OSError) as e:
        fail(str(e), ExitCode.USAGE)
    print_diff(a, b, Console(width=160, markup=False))
    return ExitCode.OK


if __name__ == "__main__":
    raise SystemExit(main())

"""The table of a kernel side (compare/judge/kernels.py): per kernel side, its worst tensors against
its noise floor (or, in float64, against the reference op's float64 bounds)."""

from __future__ import annotations

from compare.reporting.cells import fmt

SHOWN = 6  # rows a side: its worst tensors by their share of the bound


def _row(name: str, key: str, row: dict) -> list[str]:
    error = row.get("kernel_error", row.get("error"))
    reference = row.get("reference_error")
    return [
        name,
        key,
        fmt(error, ".2e"),
        fmt(reference, ".2e") if reference is not None else "-",
        fmt(row["bound"], ".2e"),
        "within" if row["within"] else "OUTSIDE",
    ]


def kernel_tables(report: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    rows = []
    for name, judged in report["kernels"].items():
        if judged["passed"] is None:
            why = judged.get("why", "")
            said = "float64 unsupported" if judged.get("float64") == "unsupported" else "not judged"
            rows.append([name, f"{judged['kernel']}: {said}", why[:120], "-", "-", "-"])
            continue
        worst = sorted(
            judged["tensors"].items(),
            key=lambda kv: (
                -(kv[1].get("kernel_error", kv[1].get("error")) / kv[1]["bound"])
                if kv[1]["bound"]
                else 0.0
            ),
        )
        rows += [_row(name, key, row) for key, row in worst[:SHOWN]]
        where = judged.get("first_module")
        if where:
            rows.append([name, f"first module outside: {where}", "", "", "", "OUTSIDE"])
    title = (
        "Kernels: each kernel side's run against its reference op's float64 run (the oracle), "
        "beside the reference op's own run in the same dtype; bound = 3 x reference error + eps "
        "(a float64 run: the kernel against its reference op in float64, by float64's bounds)"
    )
    header = ["backend", "tensor", "kernel error", "reference error", "bound", ""]
    return [(title, header, rows)]

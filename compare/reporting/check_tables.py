"""The tables of the checks made before anything trains: the start state's
(compare/judge/start_state.py: every pair compared and its verdict, then what one side holds alone)
and each runtime's op check (common/ops.py: report.json's `ops`, built here from the checks'
files)."""

from __future__ import annotations

import json
from pathlib import Path

from common.ops import OPS_DIR, OPS_FILE, refusal
from common.runtime_behaviours import met
from common.vocab import ReportStatus
from compare.judge.verdict import CheckResult

SHOWN = 30  # rows of each kind; the JSON has them all


def start_state_tables(report: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    section = report["start_state"]
    differ, carried = {d["torch"]: d for d in section["differ"]}, set(section.get("carried", ()))
    rows = [
        [
            nnx,
            torch,
            "differs: " + differ[torch]["why"]
            if torch in differ
            else "carried from the checkpoint to both sides"
            if torch in carried
            else "agrees",
        ]
        for torch, nnx in list(section["links"].items())[:SHOWN]
    ]
    rows += [
        ["-", name, "not compared: no NNX Variable of its name"]
        for name in section["torch_only"][:SHOWN]
    ]
    rows += [
        [name, "-", "not compared: no torch buffer of its name"]
        for name in section["nnx_only"][:SHOWN]
    ]
    title = (
        f"Start state: {section['compared']} compared, {len(differ)} differ"
        + (f", {len(carried)} carried from the checkpoint" if carried else "")
        + f" ({section['when']})"
    )
    return [(title, ["NNX", "torch", "verdict"], rows)]


def ops_check(out: Path, names: list[str]) -> CheckResult:
    """report.json's `ops`: each runtime's op check of this run ({ops, calls, missing, fallbacks,
    failed_op, error, refused}); always OK (a runtime it refuses is a backend that could not run:
    the backends' check says so)."""
    section = {}
    for name in names:
        path = out / OPS_DIR / name / OPS_FILE
        if path.exists():
            ops = json.loads(path.read_text())
            section[name] = {
                "ops": len(ops["calls"]),
                "calls": sum(ops["calls"].values()),
                "missing": ops["missing"],
                "fallbacks": ops["fallbacks"],
                "failed_op": ops["failed_op"],
                "error": ops["error"],
                "refused": refusal(ops),
                "behaviours": met(ops),
            }
    return CheckResult("ops", ReportStatus.OK, section=section or None)


def _ops_verdict(entry: dict) -> str:
    if entry["refused"]:
        return "refused: " + entry["refused"]
    if entry["fallbacks"]:
        return (
            f"runs: {len(entry['fallbacks'])} op(s) fall back to the CPU, each copying its "
            "tensors to the host and "
            "back in every step (its step time includes them)"
        )
    return "runs: every op lowered"


def ops_tables(report: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    rows = [
        [
            name,
            f"{e['ops']} ({e['calls']} calls)",
            ", ".join(e["missing"]) or "-",
            ", ".join(f"{op} x{n}" for op, n in e["fallbacks"].items()) or "-",
            _ops_verdict(e),
        ]
        for name, e in report["ops"].items()
    ]
    return [
        (
            "Ops: one traced step of each runtime that checks them, before any backend trained",
            [
                "runtime",
                "ops (calls)",
                "no lowering",
                "CPU fallbacks (calls in the step)",
                "verdict",
            ],
            rows,
        )
    ]

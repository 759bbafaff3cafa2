"""The start state's table (compare/judge/start_state.py): every pair compared and its verdict, then what one side
holds alone (not compared)."""
from __future__ import annotations

SHOWN = 30  # rows of each kind; the JSON has them all


def start_state_tables(report: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    section = report["start_state"]
    differ = {d["torch"]: d for d in section["differ"]}
    rows = [[nnx, torch, "differs: " + differ[torch]["why"] if torch in differ else "agrees"]
            for torch, nnx in list(section["links"].items())[:SHOWN]]
    rows += [["-", name, "not compared: no NNX Variable of its name"] for name in section["torch_only"][:SHOWN]]
    rows += [[name, "-", "not compared: no torch buffer of its name"] for name in section["nnx_only"][:SHOWN]]
    title = f"Start state: {section['compared']} compared, {len(differ)} differ ({section['when']})"
    return [(title, ["NNX", "torch", "verdict"], rows)]

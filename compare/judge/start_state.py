"""A twin's start state judged (common/twin/start_state.py): each buffer linked to its NNX Variable,
compared as both sides' factories built it, before anything trains. Floats within the forward bounds
of their dtype (they are computed, as activations are, not trained), integers and booleans exactly;
a pair whose shapes differ differs. A buffer a checkpoint carries to both sides
(common/weights/carried.py) is not judged as built: both runs start from the checkpoint's value, as
`load_state_dict` would put it in place of the factory's. What was not compared is listed: a torch
buffer with no NNX Variable of its name (a port that computes its table in the forward) and the
other way round."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from common.twin.start_state import NNX_STATE, STATE_LINKS, TORCH_STATE
from common.vocab import ReportStatus
from common.weights import read_safetensors
from common.weights.carried import BUFFER_NAMES, INIT_FILE
from compare.judge.tolerances import load_policy
from compare.judge.verdict import CheckResult

WHEN = (
    "at the start, as each side's factory builds it, but for the buffers a checkpoint carries to "
    "both sides; "
    "after training too, with the parameters (parity's `buffers/` tensors): state that training "
    "changes (an "
    "EMA, a counter)"
)


def _arrays(path: Path) -> dict[str, np.ndarray]:
    # 16-bit floats widened when written: storable
    return read_safetensors(path, f"start state {path}")[0]


def _carried(start_dir: Path) -> set[str]:
    """The torch names of the buffers the start file carries from a checkpoint (none without
    one)."""
    init = start_dir / INIT_FILE
    metadata = read_safetensors(init, f"start {init}", header_only=True)[2] if init.exists() else {}
    return set(json.loads(metadata.get(BUFFER_NAMES, "{}")).values())


def _differs(torch_value: np.ndarray, nnx_value: np.ndarray, bounds: dict) -> dict | None:
    """How the two values differ ({why, max_abs, bound}), or None when they agree; `bounds`: {dtype:
    forward bound}."""
    if torch_value.shape != nnx_value.shape:
        return {
            "why": f"shape {list(torch_value.shape)} on the torch side, {list(nnx_value.shape)} "
            "on the NNX side"
        }
    if torch_value.dtype.kind != "f" or nnx_value.dtype.kind != "f":
        unequal = int(np.count_nonzero(torch_value != nnx_value))
        return (
            {"why": f"{unequal} of {torch_value.size} values differ (compared exactly)"}
            if unequal
            else None
        )
    dtype = "float64" if torch_value.dtype == nnx_value.dtype == np.float64 else "float32"
    bound = bounds[dtype]
    a, b = torch_value.astype(np.float64), nnx_value.astype(np.float64)
    error = np.abs(a - b)
    over = error > bound["atol"] + bound["rtol"] * np.abs(a)
    if not over.any():
        return None
    return {
        "why": f"{int(over.sum())} of {a.size} values beyond {dtype}'s bounds (atol "
        f"{bound['atol']:g}, rtol "
        f"{bound['rtol']:g}), max |diff| {float(error.max()):.3g}",
        "max_abs": float(error.max()),
    }


def start_state_check(start_dir: Path, profile: str) -> CheckResult:
    """The start state's check: fails the run (parity failed) when a linked pair differs, naming it;
    `profile`: the tolerance profile, whose forward bounds of the values' dtype apply."""
    linked = json.loads((start_dir / STATE_LINKS).read_text())
    torch_state, nnx_state = _arrays(start_dir / TORCH_STATE), _arrays(start_dir / NNX_STATE)
    carried = _carried(start_dir)
    differ, bounds = (
        [],
        {dtype: load_policy(profile, dtype)["forward"] for dtype in ("float32", "float64")},
    )
    for torch_name, nnx_name in linked["links"].items():
        found = (
            None
            if torch_name in carried
            else _differs(torch_state[torch_name], nnx_state[nnx_name], bounds)
        )
        if found:
            differ.append({"nnx": nnx_name, "torch": torch_name, **found})
    section = {
        "compared": len(set(linked["links"]) - carried),
        "carried": sorted(carried),
        "differ": differ,
        "torch_only": linked["torch_only"],
        "nnx_only": linked["nnx_only"],
        "links": linked["links"],
        "when": WHEN,
    }
    if not differ:
        return CheckResult("start_state", ReportStatus.OK, section=section)
    first = differ[0]
    more = f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""
    return CheckResult(
        "start_state",
        ReportStatus.PARITY_FAILED,
        f"the start state differs at `{first['nnx']}` (torch `{first['torch']}`): "
        f"{first['why']}{more}",
        section,
    )

"""What a runtime cannot run, known before it trains: the op check's file (numpy-free).

A runtime whose registry row `checks_ops` runs one traced forward and backward of step 0 (compare's
capture launch with `--check-ops`, compare/runs/op_checks.py) under its op watch
(torchax_impl/ops.py: the ops torchax has no lowering for, from its own table;
torch_xla_impl/ops.py: the ops it runs as CPU fallbacks, from its own metrics, and the one whose
fallback fails) and writes what it saw into OPS_FILE. compare refuses a runtime that cannot run the
model, in one line naming the op, before any backend trains, and reports every runtime's table."""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

OPS_FILE = "ops.json"
# what a jitted step's trace raises where the model reads a traced value into Python (jax.errors)
UNTRACEABLE = (
    "ConcretizationTypeError",
    "TracerBoolConversionError",
    "TracerIntegerConversionError",
    "TracerArrayConversionError",
)
OPS_DIR = "ops"  # a compare run's op checks: <run>/ops/<backend>/ (ops.json, the check's logs)


def found(
    runtime: str,
    calls: dict[str, int],
    missing: list[str],
    fallbacks: dict[str, int],
    failed_op: str | None,
    error: BaseException | None,
    behaviours: dict | None = None,
) -> dict:
    """The file's contents: every op the step called (with its calls), those with no lowering, those
    run as CPU fallbacks (with their calls), the op whose fallback failed, the error the step ended
    on (one line), and the runtime's known behaviours the model meets ({id: what was seen},
    common/runtime_behaviours.py)."""
    line = None
    if error is not None:
        site = _model_site(error)
        line = (
            f"{type(error).__name__}: "
            f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}"
            + (f" (at {site})" if site else "")
        )
    return {
        "runtime": runtime,
        "calls": dict(sorted(calls.items())),
        "missing": missing,
        "fallbacks": dict(sorted(fallbacks.items())),
        "failed_op": failed_op,
        "error": line,
        "behaviours": behaviours or {},
    }


# the frameworks' own code and this toolkit's: a step's error is placed in the code it called
NOT_THE_MODEL = tuple(
    f"{os.sep}{name}{os.sep}" for name in ("jax", "jaxlib", "flax", "optax", "torch", "torchax")
) + tuple(
    str(Path(__file__).resolve().parents[1] / top) + os.sep
    for top in ("common", "driver", "jax_impl", "torch_impl", "torchax_impl", "torch_xla_impl")
)


def _model_site(error: BaseException) -> str | None:
    """file:line of the innermost frame of `error`'s traceback in the model's code (a user's, or a
    library's such as transformers), not a framework's or this toolkit's."""
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if not any(part in f.filename for part in NOT_THE_MODEL)
    ]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None


def read_ops(folder) -> dict:
    """A runtime's op check file in `folder` (a compare run's <run>/ops/<backend>/), or {} where it
    has none or it cannot be read."""
    try:
        return json.loads((Path(folder) / OPS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def refusal(ops: dict) -> str | None:
    """One line naming why the runtime cannot run the model, or None when it can (so far as one step
    shows)."""
    runtime = ops["runtime"]
    if ops["missing"]:
        return (
            f"{runtime} cannot run this model: {ops['missing'][0]} has no lowering in {runtime} "
            "(one traced "
            "step of it, before any backend trained; ops after it were not reached)"
        )
    if (ops.get("error") or "").startswith(UNTRACEABLE):
        return (
            f"{runtime} cannot run this model in its jitted step: {ops['error']} (one traced step "
            "of it, before any backend trained): the model reads a tensor's value into Python "
            "(.item(), `if` on a tensor); keep it a tensor (torch.where, a mask), or leave "
            f"{runtime} out of --backend"
        )
    if ops["failed_op"]:
        return (
            f"{runtime} cannot run this model: {ops['failed_op']} runs as a CPU fallback and "
            "fails there "
            f"({ops['error']}; one traced step of it, before any backend trained)"
        )
    return None

"""Why a step recompiled, in `common.vocab.RecompileCause` words, from what each framework tells us.

- JAX (and torchax, which compiles through JAX): the message `jax_explain_cache_misses` logs for the
  closest earlier cache key: "different input types: at batch.inputs, now i16[8,64] and before
  i32[8,64]", or a static argument's `Static(val=8.0)` against `Static(val=7.0)`.
- torch_xla: its Compilation Analysis says only that a sync compiled a new graph (with the Python
  frame that cut it), so the cause is read from what changed: the batch the host fed (shape, dtype),
  else the two graphs as traced (XLA's pre-optimization dump): same ops but other constants is a
  Python value baked into the graph; other ops is a new program.
Each entry keeps the framework's own words beside ours.
"""

from __future__ import annotations

import re
from collections import Counter

from analysis.hlo import op_histogram
from common.vocab import RECOMPILE_CAUSE_MEANINGS, RecompileCause

_TYPE_CHANGE = re.compile(r"\* at ([^\n;]+?), now (\w+)\[([\d,]*)\] and before (\w+)\[([\d,]*)\]")
_STATIC_CHANGE = re.compile(
    r"at input path (.+?), now .*?Static\(val=(.*?)\) and before .*?Static\(val=(.*?)\)"
)
_CONSTANT = re.compile(r"=\s*\w+\[\]\s*constant\(([^)]*)\)")


def entry(step: int, fun_name: str, cause: RecompileCause, detail: str, framework: str) -> dict:
    """A record's recompile_causes item."""
    return {
        "step": step,
        "fun_name": fun_name,
        "kind": str(cause),
        "cause": f"{RECOMPILE_CAUSE_MEANINGS[cause]}: {detail}"
        if detail
        else RECOMPILE_CAUSE_MEANINGS[cause],
        "framework": framework,
    }


def classify_jax(message: str) -> tuple[RecompileCause, str]:
    """(cause, detail) from a JAX cache-miss explanation."""
    changes = _TYPE_CHANGE.findall(message)
    shapes = [f"{where} {b}[{bd}] -> {a}[{ad}]" for where, a, ad, b, bd in changes if ad != bd]
    if shapes:
        return RecompileCause.INPUT_SHAPE, "; ".join(shapes)
    dtypes = [f"{where} {b}[{bd}] -> {a}[{ad}]" for where, a, ad, b, bd in changes if a != b]
    if dtypes:
        return RecompileCause.INPUT_DTYPE, "; ".join(dtypes)
    static = _STATIC_CHANGE.search(message)
    if static:
        return (
            RecompileCause.PYTHON_VALUE,
            f"static argument {static.group(1)} {static.group(3)} -> {static.group(2)}",
        )
    if "different input pytree" in message or "different" in message:
        return RecompileCause.NEW_PROGRAM, "JAX saw a different input structure or function"
    return RecompileCause.UNKNOWN, ""


def constants(hlo_text: str) -> Counter:
    """Scalar constants of a module, by value (the numbers a trace baked in)."""
    return Counter(_CONSTANT.findall(hlo_text))


def classify_graph_change(
    before_hlo: str | None, after_hlo: str | None, fed_before: tuple | None, fed_after: tuple | None
) -> tuple[RecompileCause, str]:
    """(cause, detail) of a new graph from the batch fed at the two steps ((shape, dtype) each) and
    the two graphs as traced (None when not dumped)."""
    if fed_before and fed_after and fed_before[0] != fed_after[0]:
        return RecompileCause.INPUT_SHAPE, f"batch inputs {fed_before[0]} -> {fed_after[0]}"
    if fed_before and fed_after and fed_before[1] != fed_after[1]:
        return RecompileCause.INPUT_DTYPE, f"batch inputs {fed_before[1]} -> {fed_after[1]}"
    if before_hlo is None or after_hlo is None:
        return RecompileCause.UNKNOWN, "the graphs were not dumped"
    ops_before, ops_after = op_histogram(before_hlo), op_histogram(after_hlo)
    differing = {
        op for op in set(ops_before) | set(ops_after) if ops_before.get(op) != ops_after.get(op)
    }
    if differing and differing <= {"parameter", "constant"}:
        return RecompileCause.PYTHON_VALUE, (
            f"scalars moved between baked constants and graph inputs (constants "
            f"{ops_before.get('constant', 0)} -> {ops_after.get('constant', 0)}, "
            f"inputs {ops_before.get('parameter', 0)} -> "
            f"{ops_after.get('parameter', 0)})"
        )
    if differing:
        added = sorted(op for op in ops_after if ops_after[op] > ops_before.get(op, 0))
        removed = sorted(op for op in ops_before if ops_before[op] > ops_after.get(op, 0))
        return (
            RecompileCause.NEW_PROGRAM,
            f"ops added: {', '.join(added) or 'none'}; removed: {', '.join(removed) or 'none'}",
        )
    c_before, c_after = constants(before_hlo), constants(after_hlo)
    if c_before != c_after:
        gone, new = sorted((c_before - c_after).elements()), sorted((c_after - c_before).elements())
        return RecompileCause.PYTHON_VALUE, f"graph constants {', '.join(gone)} -> {', '.join(new)}"
    return RecompileCause.UNKNOWN, "same inputs, ops and constants"

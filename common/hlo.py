"""Statistics of optimized HLO text, the same for both twins."""
from __future__ import annotations

import re
from collections import Counter

# Ops worth a column in the report: compute, fusion and every collective.
REPORTED_OPS = ("fusion", "dot", "convolution", "all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                "collective-permute", "custom-call")

# `%name = f32[2,3]{1,0} opcode(...)`, or a tuple type `(f32[], s32[]) opcode(...)`.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?:\([^=]*?\)|[\w\[\]{},:\s]*?)\s*([a-z][\w\-]*)\(")


def op_histogram(hlo_text: str) -> dict[str, int]:
    """Instruction count per opcode over every computation (fused bodies included).

    Async collectives (`all-reduce-start`/`-done`) count once, as the collective.
    """
    counts: Counter[str] = Counter()
    for line in hlo_text.splitlines():
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        op = m.group(1)
        if op.endswith("-done"):
            continue
        counts[op.removesuffix("-start")] += 1
    return dict(sorted(counts.items()))


def reported_ops(histogram: dict[str, int]) -> dict[str, int]:
    return {op: histogram.get(op, 0) for op in REPORTED_OPS}

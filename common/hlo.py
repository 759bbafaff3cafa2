"""Statistics of optimized HLO text, the same for every backend that compiles through XLA."""
from __future__ import annotations

import re
from collections import Counter

# Ops worth a column in the report: compute, fusion and every collective.
REPORTED_OPS = ("fusion", "dot", "convolution", "all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                "collective-permute", "custom-call")

# `%name = f32[2,3]{1,0} opcode(...)`, or a tuple type `(f32[], s32[]) opcode(...)`.
_COMMENT = re.compile(r"/\*.*?\*/")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?:\([^=]*?\)|[\w\[\]{},:\s]*?)\s*([a-z][\w\-]*)\(")


def op_histogram(hlo_text: str) -> dict[str, int]:
    """Instruction count per opcode over every computation (fused bodies included).

    Async collectives (`all-reduce-start`/`-done`) count once, as the collective.
    """
    counts: Counter[str] = Counter()
    for line in hlo_text.splitlines():
        m = _INSTRUCTION.match(_COMMENT.sub("", line))  # tuple types carry /*index=5*/ markers
        if not m:
            continue
        op = m.group(1)
        if op.endswith("-done"):
            continue
        counts[op.removesuffix("-start")] += 1
    return dict(sorted(counts.items()))


def reported_ops(histogram: dict[str, int]) -> dict[str, int]:
    return {op: histogram.get(op, 0) for op in REPORTED_OPS}


_DEFINITION = re.compile(r"^\s*(?:ROOT\s+)?(%?[\w.\-]+)\s*=\s*[a-z]+\d*\[([\d,]*)\]")
_OPERANDS = re.compile(r"\b(dot|convolution)\((%?[\w.\-]+),\s*(%?[\w.\-]+)\)")
_DIMS = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_LABELS = re.compile(r"dim_labels=\w+_(\w+)->")
_LHS_DILATE = re.compile(r"lhs_dilate=([\dx]+)")


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in text.split(",") if d)


def matmul_flops(hlo_text: str) -> float:
    """Useful flops of every dot and convolution in HLO text of one or more modules (2 per multiply-add).

    The same count for both twins' optimized HLO, so MFU compares like with
    like; element-wise work is left out (as in the usual 6*N*tokens estimate).
    Instruction names repeat across modules, so each module is read apart.
    """
    modules = re.split(r"^(?=HloModule )", hlo_text, flags=re.MULTILINE)
    return sum(_module_matmul_flops(m) for m in modules if m.strip())


def _module_matmul_flops(hlo_text: str) -> float:
    shapes: dict[str, tuple[int, ...]] = {}
    for line in hlo_text.splitlines():
        m = _DEFINITION.match(line)
        if m:
            shapes[m.group(1).lstrip("%")] = _shape(m.group(2))
    total = 0.0
    for line in hlo_text.splitlines():
        d, ops = _DEFINITION.match(line), _OPERANDS.search(line)
        if not d or not ops:
            continue
        out = _shape(d.group(2))
        lhs, rhs = shapes.get(ops.group(2).lstrip("%")), shapes.get(ops.group(3).lstrip("%"))
        if lhs is None or rhs is None:
            continue
        n_out = 1
        for v in out:
            n_out *= v
        if ops.group(1) == "dot":
            contracting = _DIMS.search(line)
            k = 1
            for dim in _shape(contracting.group(1)) if contracting else ():
                k *= lhs[dim]
        else:
            labels = _LABELS.search(line)
            o_index = labels.group(1).index("o") if labels else len(rhs) - 1
            k = 1
            for i, v in enumerate(rhs):
                if i != o_index:
                    k *= v
            # A strided conv's input gradient is a conv over its input dilated with zeros (lhs_dilate):
            # only one window position in prod(dilation) meets a real value. Counting those zeros would
            # overstate useful flops (1.9x for cnn-digits); torch's FlopCounterMode counts none either.
            dilate = _LHS_DILATE.search(line)
            for factor in _shape(dilate.group(1).replace("x", ",")) if dilate else ():
                k /= factor
        total += 2.0 * n_out * k
    return total

"""What a compiled XLA program does, read from its optimized HLO text: the same reading for every
backend, and the one reader of HLO text in the toolkit (`parse_module`).

`op_histogram` counts instructions per opcode; `matmul_flops` the useful flops of every dot and
convolution; `program_summary(text)` counts, per settled train step (one or more modules):
kernels launched (fusions plus unfused ops in the computations that run
as such: the entry, while/conditional bodies, called computations; not the
bodies of fusions or reducers), fusions by kind, dots and convolutions
(inside fusions too), element-wise ops and copies/transposes left outside
fusions, every collective with its element count and bytes, custom calls by
target, RNG ops, and the largest buffers the kernels produce.

Only the text is read, so compare can summarise any backend's program (and
`python -m compare.hlo` any two HLO files) without importing a framework.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

COLLECTIVES = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
    "ragged-all-to-all",
)
RNG_OPS = ("rng", "rng-bit-generator", "rng-get-and-update-state")
# Instructions that launch no work of their own.
NO_KERNEL = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "opt-barrier",
    "after-all",
    "partition-id",
    "replica-id",
    "add-dependency",
    "domain",
    "while",
    "conditional",
    "call",
}
ELEMENTWISE = {
    "abs",
    "add",
    "and",
    "atan2",
    "cbrt",
    "ceil",
    "clamp",
    "compare",
    "convert",
    "cosine",
    "divide",
    "exponential",
    "exponential-minus-one",
    "floor",
    "is-finite",
    "log",
    "log-plus-one",
    "logistic",
    "maximum",
    "minimum",
    "multiply",
    "negate",
    "not",
    "or",
    "power",
    "remainder",
    "round-nearest-afz",
    "round-nearest-even",
    "rsqrt",
    "select",
    "shift-left",
    "shift-right-arithmetic",
    "shift-right-logical",
    "sign",
    "sine",
    "sqrt",
    "subtract",
    "tan",
    "tanh",
    "xor",
    "erf",
}
BYTES_PER_ELEMENT = {
    "pred": 1,
    "s2": 0.25,
    "u2": 0.25,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}

# the signature is optional
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\)\s*->\s*.*)?\{\s*$")
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\([^=]*?\)|[\w\[\]{},:\s]*?)\s*([a-z][\w\-]*)\((.*)$"
)
_COMMENT = re.compile(r"/\*.*?\*/")
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
_CALLED = re.compile(
    r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_FUSION_KIND = re.compile(r"kind=(k\w+)")
_CUSTOM_FUSION = re.compile(r'"kind":"([^"]+)"')
_CUSTOM_TARGET = re.compile(r'custom_call_target="([^"]+)"')


@dataclass
class Instruction:
    computation: str
    name: str
    type_text: str
    opcode: str
    rest: str

    def _arrays(self) -> list[tuple[str, int]]:
        """(dtype, element count) of every array in the result type (one, or a tuple's)."""
        return [
            (dtype, math.prod(int(d) for d in dims.split(",") if d))
            for dtype, dims in _ARRAY.findall(self.type_text)
        ]

    @property
    def elements(self) -> int:
        return sum(n for _, n in self._arrays())

    @property
    def bytes(self) -> float:
        return sum(n * BYTES_PER_ELEMENT.get(dtype, 4) for dtype, n in self._arrays())


def parse_module(text: str) -> tuple[str | None, dict[str, list[Instruction]]]:
    """(entry computation name, {computation: instructions}) of one HLO module's text."""
    entry, current, computations = None, None, {}
    for line in text.splitlines():
        line = _COMMENT.sub("", line)  # tuple types carry /*index=5*/ markers
        header = _HEADER.match(line)
        if header and "=" not in line.split("(", 1)[0]:
            current = header.group(2)
            computations[current] = []
            if header.group(1):
                entry = current
            continue
        m = _INSTRUCTION.match(line)
        if m and current is not None:
            computations[current].append(
                Instruction(current, m.group(1), m.group(2), m.group(3), m.group(4))
            )
    return entry, computations


def executed_computations(
    entry: str | None, computations: dict[str, list[Instruction]]
) -> set[str]:
    """The entry and every computation it runs as a sequence of kernels (control flow, calls):
    not fusion bodies, nor the reducers of reduce/all-reduce/scatter (`to_apply` of those)."""
    if entry is None:
        return set()
    seen, todo = set(), [entry]
    while todo:
        name = todo.pop()
        if name in seen or name not in computations:
            continue
        seen.add(name)
        for ins in computations[name]:
            for key, callee in _CALLED.findall(ins.rest):
                if key in ("body", "condition", "true_computation", "false_computation") or (
                    key == "to_apply" and ins.opcode == "call"
                ):
                    todo.append(callee)
            branches = _BRANCHES.search(ins.rest)
            if branches:
                todo += [b.strip().lstrip("%") for b in branches.group(1).split(",") if b.strip()]
    return seen


def split_modules(text: str) -> list[str]:
    return [m for m in re.split(r"^(?=HloModule )", text, flags=re.MULTILINE) if m.strip()]


Modules = list  # [parse_module's (entry, computations)] of every module of one program's text


def parse_modules(text: str) -> Modules:
    """Every module of `text` parsed, once: each reader below takes this or the text (which it
    parses)."""
    return [parse_module(m) for m in split_modules(text)]


def _parsed(program: str | Modules) -> Modules:
    return parse_modules(program) if isinstance(program, str) else program


def program_summary(text: str | Modules, largest: int = 5) -> dict:
    """The counts described in the module docstring, summed over every module in `text`."""
    kernels, fusions, matmul, unfused_matmul = 0, Counter(), Counter(), 0
    elementwise, copies, transposes, rng, custom = 0, 0, 0, 0, Counter()
    collectives: dict[str, dict] = {}
    buffers: list[Instruction] = []
    for entry, computations in _parsed(text):
        executed = executed_computations(entry, computations)
        for name, instructions in computations.items():
            for ins in instructions:
                op = ins.opcode.removesuffix("-start")
                if ins.opcode.endswith("-done"):
                    continue
                if op in ("dot", "convolution"):
                    matmul[op] += 1
                if name not in executed:
                    continue
                if op in COLLECTIVES:
                    c = collectives.setdefault(op, {"count": 0, "elements": 0, "bytes": 0})
                    c["count"] += 1
                    c["elements"] += ins.elements
                    c["bytes"] += int(ins.bytes)
                if op in NO_KERNEL:
                    continue
                kernels += 1
                buffers.append(ins)
                if op == "fusion":
                    kind = _FUSION_KIND.search(ins.rest)
                    custom_kind = _CUSTOM_FUSION.search(ins.rest)
                    label = kind.group(1) if kind else "unknown"
                    fusions[
                        f"{label}({custom_kind.group(1)})"
                        if label == "kCustom" and custom_kind
                        else label
                    ] += 1
                elif op in ("dot", "convolution"):
                    unfused_matmul += 1
                elif op in ELEMENTWISE:
                    elementwise += 1
                elif op == "copy":
                    copies += 1
                elif op == "transpose":
                    transposes += 1
                elif op in RNG_OPS:
                    rng += 1
                elif op == "custom-call":
                    target = _CUSTOM_TARGET.search(ins.rest)
                    custom[target.group(1) if target else "?"] += 1
    buffers.sort(key=lambda i: -i.bytes)
    return {
        "kernels": kernels,
        "fusions": dict(sorted(fusions.items())),
        "dot": matmul["dot"],
        "convolution": matmul["convolution"],
        "unfused_dot_or_convolution": unfused_matmul,
        "unfused_elementwise": elementwise,
        "copies": copies,
        "transposes": transposes,
        "collectives": {op: collectives[op] for op in COLLECTIVES if op in collectives},
        "custom_calls": dict(sorted(custom.items())),
        "rng": rng,
        "largest_buffers": [
            {"name": b.name, "op": b.opcode, "shape": b.type_text.strip(), "bytes": int(b.bytes)}
            for b in buffers[:largest]
        ],
    }


_ALLOCATION = re.compile(r"^allocation \d+: size (\d+)(.*)$")
_TOTAL = re.compile(r"^Total bytes used: (\d+)")


def buffer_assignment_memory(text: str) -> dict:
    """Memory of one compiled module from XLA's buffer-assignment dump (`--xla_dump_to`): bytes of
    the arguments (`parameter` allocations), outputs (`maybe-live-out`), constants, temporaries (the
    rest; thread-local scratch left out) and XLA's own total, named like JAX's memory_analysis()."""
    out = {
        "argument_size_in_bytes": 0,
        "output_size_in_bytes": 0,
        "constant_size_in_bytes": 0,
        "temp_size_in_bytes": 0,
    }
    total = None
    for line in text.splitlines():
        m = _ALLOCATION.match(line)
        if m:
            size, tags = int(m.group(1)), m.group(2)
            if "thread-local" in tags:
                continue
            key = (
                "argument_size_in_bytes"
                if "parameter" in tags
                else "output_size_in_bytes"
                if "maybe-live-out" in tags or "output shape" in tags
                else "constant_size_in_bytes"
                if "constant" in tags
                else "temp_size_in_bytes"
            )
            out[key] += size
        t = _TOTAL.match(line)
        if t:
            total = int(t.group(1))
    out["total_bytes_used"] = total
    return out


# Ops worth a column in the report: compute, fusion and every collective.
REPORTED_OPS = (
    "fusion",
    "dot",
    "convolution",
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "custom-call",
)


def instructions(text: str | Modules):
    """Every instruction of every computation of every module in `text`, in order."""
    for _, computations in _parsed(text):
        for body in computations.values():
            yield from body


def op_histogram(hlo_text: str | Modules) -> dict[str, int]:
    """Instruction count per opcode over every computation (fused bodies included).

    Async collectives (`all-reduce-start`/`-done`) count once, as the collective.
    """
    counts = Counter(
        i.opcode.removesuffix("-start")
        for i in instructions(hlo_text)
        if not i.opcode.endswith("-done")
    )
    return dict(sorted(counts.items()))


def reported_ops(histogram: dict[str, int]) -> dict[str, int]:
    return {op: histogram.get(op, 0) for op in REPORTED_OPS}


_PLAIN_ARRAY = re.compile(r"^\s*[a-z]+\d*\[([\d,]*)\]")
_OPERANDS = re.compile(r"^(%?[\w.\-]+),\s*(%?[\w.\-]+)\)")
_DIMS = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_LABELS = re.compile(r"dim_labels=\w+_(\w+)->")
_LHS_DILATE = re.compile(r"lhs_dilate=([\dx]+)")


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in text.split(",") if d)


def matmul_flops(hlo_text: str | Modules) -> float:
    """Useful flops of every dot and convolution in HLO text of one or more modules (2 per
    multiply-add).

    The same count for both twins' optimized HLO, so MFU compares like with
    like; element-wise work is left out (as in the usual 6*N*tokens estimate).
    Instruction names repeat across modules, so each module is read apart.
    """
    return sum(
        _module_matmul_flops([i for body in computations.values() for i in body])
        for _, computations in _parsed(hlo_text)
    )


def _module_matmul_flops(module: list[Instruction]) -> float:
    shapes = {i.name: _shape(m.group(1)) for i in module if (m := _PLAIN_ARRAY.match(i.type_text))}
    total = 0.0
    for ins in module:
        ops = _OPERANDS.match(ins.rest) if ins.opcode in ("dot", "convolution") else None
        if ins.name not in shapes or not ops:
            continue
        lhs, rhs = shapes.get(ops.group(1).lstrip("%")), shapes.get(ops.group(2).lstrip("%"))
        if lhs is None or rhs is None:
            continue
        n_out = math.prod(shapes[ins.name])
        if ins.opcode == "dot":
            contracting = _DIMS.search(ins.rest)
            k = math.prod(lhs[dim] for dim in (_shape(contracting.group(1)) if contracting else ()))
        else:
            labels = _LABELS.search(ins.rest)
            o_index = labels.group(1).index("o") if labels else len(rhs) - 1
            k = math.prod(v for i, v in enumerate(rhs) if i != o_index)
            # A strided conv's input gradient is a conv over its input dilated with zeros
            # (lhs_dilate): only one window position in prod(dilation) meets a real value. Counting
            # those zeros would overstate useful flops (1.9x for cnn-digits); torch's
            # FlopCounterMode counts none either.
            dilate = _LHS_DILATE.search(ins.rest)
            for factor in _shape(dilate.group(1).replace("x", ",")) if dilate else ():
                k /= factor
        total += 2.0 * n_out * k
    return total

"""What a verdict could have seen: the smallest relative change each compared group would have
failed.

A tensor's bound is atol + rtol * max|ref| (or a noise floor's), so a change of the tensor by a
relative amount s moves max|a - b| by s * max|ref| and fails it once s > bound / max|ref|: that is
the tensor's `sensitivity` (compare/judge/tensor_error.py). A group's sensitivity is the largest
over its judged tensors, the change that every one of them would have caught: "this pass would have
caught a relative change of 1e-9 in gradients". A port error smaller than that passes unseen; in
float32 that is often a tanh GELU or a norm's epsilon (1e-5 to 1e-4 relative), in float64 (the host
proof, --dtype float64) about 1e-9.
"""

from __future__ import annotations

import numpy as np

from compare.judge.islands import islands_words, widened_words

GROUPS = (
    ("logits", "logits"),
    ("loss", "loss"),
    ("grads", "gradients"),
    ("activations", "module outputs"),
    ("params", "final parameters"),
)
# the default float64 forward and gradient rtol (compare/judge/tolerances.py)
FLOAT64_RESOLVES = 1e-9


def _judged(row: dict) -> bool:
    return (
        row.get("sensitivity") is not None
        and row.get("judged") is not False
        and row.get("within") is not None
    )


def group_sensitivity(
    tensors: dict, loss: dict | None, forward: dict | None, unreached: set[str] = frozenset()
) -> dict[str, dict[str, float]]:
    """{group: {every, median}} of one backend's parity (compare/judge/parity.py's check_parity: its
    tensor rows, losses and first divergent module): the relative change that every tensor of the
    group would have failed (the largest of their sensitivities) and that half of them would have.
    Groups: logits, loss (step 0's, and every step's against its own bound), gradients, module
    outputs (--activations), final parameters. The `unreached` parameters
    (compare/judge/unreached.py: a step-0 gradient of rounding noise on both sides, below the
    absolute bound) are left out: no relative change of theirs is measurable."""
    found: dict[str, list[float]] = {}

    def note(group: str, value: float | None) -> None:
        if value is not None:
            found.setdefault(group, []).append(value)

    for key, row in tensors.items():
        group, _, name = key.partition("/")
        if not _judged(row) or name in unreached:
            continue
        if group == "outputs":
            note(
                "logits" if name == "logits" else "loss" if name == "loss" else "outputs",
                row["sensitivity"],
            )
        elif group in ("grads", "params"):
            note(group, row["sensitivity"])
    note("loss", (loss or {}).get("sensitivity"))
    for value in ((forward or {}).get("sensitivity") or {}).values():
        note("activations", value)
    return {g: {"every": max(v), "median": float(np.median(v))} for g, v in found.items()}


def _words(found: dict[str, float], words: str) -> str:
    every, median = found["every"], found["median"]
    return (
        f"{every:.0e} in {words}"
        if every <= 3 * median
        else f"{median:.0e} in half the {words} ({every:.0e} in every one)"
    )


def sensitivity_line(parity: dict, dtype: str) -> str:
    """One line under the verdict: what this run would have caught, group by group, and where a
    float64 run would prove more."""
    found = dict(parity.get("sensitivity") or {})
    if dtype == "bfloat16":  # its logits are judged as distributions, not by their max-abs bound
        found.pop("logits", None)
    parts = [_words(found[g], words) for g, words in GROUPS if g in found]
    if not parts:
        return "sensitivity: no tensor was judged"
    line = "would have caught a relative change of " + ", ".join(parts)
    if dtype == "bfloat16":
        line += " (logits judged as distributions: KL and top-1)"
    for what, why in (parity.get("float64_allowances") or {}).items():
        line += f"; {what}: {why}"
    if parity.get("float32_casts_widened"):
        line += "; " + widened_words(parity["float32_casts_widened"])
    if parity.get("float32_islands"):
        forward = parity.get("first_divergent_module") or {}
        line += "; " + islands_words(
            parity["float32_islands"],
            forward.get("modules_before_islands"),
            forward.get("modules_compared"),
        )
    # compare/judge/decided.py: choices flipped at ties, checked with them imposed
    if parity.get("not_judged"):
        line += f"; {parity['not_judged']}"
    if dtype != "float64":
        line += (
            "; smaller port differences pass unseen: a float64 run (--dtype float64; on the host "
            "where the "
            f"device has no float64) resolves "
            f"about {FLOAT64_RESOLVES:.0e}"
        )
    return line

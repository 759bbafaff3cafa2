"""Parameters that gradients do not reach: judged by what they can affect, not by where Adam left
them.

A parameter whose gradient is zero in exact arithmetic (an attention key bias: softmax does not
change when every score of a row moves by the same amount) gets rounding noise as its gradient. Adam
normalises each update, so that noise moves the parameter by about the learning rate per step, in a
direction each runtime draws from its own rounding: after a few steps the two sides' values differ
by a random walk, not by anything the port did (gpt-tiny in bfloat16: the key biases' final values
at 120-160 % of the params tolerance on every runtime, against 0.3-0.5 % before the first update).

Such a parameter can only affect the model through its forward, and what the forward computes is
judged already: every step's loss and the step-0 outputs. So its final value is shown but not
judged. A parameter counts as unreached when, on both sides, max|gradient| at step 0 is below a
quarter of the dtype's machine epsilon times the median over the model's parameters of max|gradient|
(the size of the rounding an exact cancellation leaves). Measured on gpt-tiny, step 0, relative to
that median: key biases 1e-5..1e-4 in bfloat16 (threshold 2e-3), the next smallest gradient (a query
bias) 1.5e-2. A port that uses a parameter on one side only is not unreached: the side that uses it
has a gradient, and the gradients are judged.
"""

from __future__ import annotations

import numpy as np

from common.files.tensor_summary import TensorSummary

EPSILON = {
    "float32": float(np.finfo(np.float32).eps),
    "bfloat16": 2.0**-7,
    "float64": float(np.finfo(np.float64).eps),
}
SHARE_OF_EPSILON = 0.25


def _max_abs(tree: dict) -> dict[str, float]:
    """{parameter: max|gradient|} of every all-finite gradient, kept whole or as a summary
    (common/files/tensor_summary.py)."""
    out = {}
    for name, g in tree.items():
        if isinstance(g, TensorSummary):
            if not g.stats["nonfinite"]:
                out[name] = g.stats["max_abs"]
        elif np.all(np.isfinite(g)):
            out[name] = float(np.max(np.abs(np.asarray(g, np.float64)))) if np.size(g) else 0.0
    return out


def unreached_params(ref_grads: dict, other_grads: dict, dtype: str) -> dict[str, dict]:
    """{parameter: {reference, other, threshold}} for every parameter whose step-0 gradient is
    rounding noise on both sides (module docstring); empty when a side saved no gradients."""
    ref, other = _max_abs(ref_grads), _max_abs(other_grads)
    if not ref or not other or dtype not in EPSILON:
        return {}
    threshold = SHARE_OF_EPSILON * EPSILON[dtype] * float(np.median(list(ref.values())))
    return {
        name: {"reference": ref[name], "other": other[name], "threshold": threshold}
        for name in sorted(set(ref) & set(other))
        if ref[name] <= threshold and other[name] <= threshold
    }


def not_judged_note(found: dict) -> str:
    return (
        f"not judged by its final value: its step-0 gradient is rounding noise on both sides (max "
        f"{found['reference']:.2g} and {found['other']:.2g}, under {found['threshold']:.2g}), so "
        "Adam's updates "
        "of it are a random walk; what it can affect, the losses and step-0 outputs, is judged"
    )


def mark_unreached(tensors: dict[str, dict], unreached: dict[str, dict]) -> None:
    """The final value (params/<name>) of every unreached parameter: shown with its error, not
    judged."""
    for name, found in unreached.items():
        entry = tensors.get(f"params/{name}")
        # missing on a side, or shapes differ: judged as it is
        if entry is None or entry.get("abs") is None:
            continue
        entry.pop("passes_with", None)
        entry.update(within=True, judged=False, note=not_judged_note(found))

"""A located module's arguments besides its first, set side by side where both captures kept them,
so that "its input agrees" is said of what was compared. Each capture keeps a module's other array
arguments of its first call, none larger than its first (`<module>:in#<position or keyword>`,
common/capture/activations.py FIELD_MARK).

Like for like: an argument both sides kept under one position or keyword, with one shape and one
kind of number (whole numbers, floats, booleans), is compared as it is; an additive mask's large
negative entries are one convention whatever their value (-inf, the dtype's minimum, -1e9), so
entries at or below MASKED on both sides count as equal. One rule knows routing, where the two sides
pass it in other forms: a Mixture-of-Experts' experts called with (tokens, k) expert indices and
(tokens, k) weights (as Hugging Face's are) on one side, and with a dense (tokens, experts) weight
matrix (as a dense-dispatch port's are) on the other: the indices and weights are scattered into the
dense form and compared.

Where an argument differs beyond its bound, the difference entered through it, not in the module:
the location moves to the code that made it, the module's parent, and further up while each parent
was itself passed an argument that differs; the report says which argument and by how much."""

from __future__ import annotations

import numpy as np

from common.capture.activations import FIELD_MARK
from common.twin.modules import ROOT_MODULE
from compare.judge.tensor_error import module_error

ROUTING = "routing weights"
MASKED = -1e4  # an additive mask's "masked" entry, in any convention


def _extras(side: dict, module: str) -> dict:
    prefix = f"{module}:in{FIELD_MARK}"
    return {k[len(prefix) :]: np.asarray(side[k]) for k in side if k.startswith(prefix)}


def _dense_routing(extras: dict, tokens: int) -> np.ndarray | None:
    """The (tokens, experts) routing matrix of a side's other arguments: itself where one is 2-D and
    float, else built from two (tokens, k) arrays, the one holding whole numbers the experts'
    indices."""
    arrays = [v for v in extras.values() if v.ndim == 2 and v.shape[0] == tokens]
    pairs = [
        (a, b)
        for a in arrays
        for b in arrays
        if a is not b
        and a.shape == b.shape
        and np.all(np.mod(a, 1) == 0)
        and a.min() >= 0
        and a.max() > b.max()
    ]
    if len(pairs) == 1:
        indices, weights = pairs[0]
        dense = np.zeros((tokens, int(indices.max()) + 1), np.float64)
        np.add.at(dense, (np.arange(tokens)[:, None], indices.astype(np.int64)), weights)
        return dense
    return arrays[0] if len(arrays) == 1 and not pairs else None


def _label(key: str) -> str:
    """An argument's name in the report: its position counted from 1 (the first input is the 1st),
    or its keyword."""
    if not key.isdigit():
        return f"argument `{key}`"
    n = int(key) + 1
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix} argument"


def entered_words(via: dict) -> str:
    """What `entered_through` says, in the report's words."""
    verb = "differ" if via["what"] == ROUTING else "differs"
    return f"the {via['what']} it passes to {via['module']} {verb}"


def _like_for_like(a: np.ndarray, b: np.ndarray) -> bool:
    kinds = {"i": "int", "u": "int", "f": "float", "b": "bool"}
    return a.shape == b.shape and kinds.get(a.dtype.kind, a.dtype.kind) == kinds.get(
        b.dtype.kind, b.dtype.kind
    )


def _unmasked(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Floats with the entries both sides mask (at or below MASKED) set to zero on both."""
    if a.dtype.kind != "f":
        return a, b
    both = (a <= MASKED) & (b <= MASKED)
    if not both.any():
        return a, b
    return np.where(both, 0, a), np.where(both, 0, b)


def compare_extra_inputs(
    ref: dict, other: dict, module: str, bounds: dict, names: tuple[str, str]
) -> dict | None:
    """{label: error} of `module`'s other arguments both sides kept, compared as the module
    docstring says; None when none could be set side by side."""
    a, b = _extras(ref, module), _extras(other, module)
    if not a or not b:
        return None
    found = {
        _label(k): module_error(
            *_unmasked(a[k], b[k]), bounds, names, f"activations/{module}:in{FIELD_MARK}{k}"
        )
        for k in a
        if k in b and _like_for_like(a[k], b[k])
    }
    if found:
        return found
    tokens = next(iter(a.values())).shape[0]
    dense_a, dense_b = _dense_routing(a, tokens), _dense_routing(b, tokens)
    if dense_a is None or dense_b is None:
        return None
    experts = max(dense_a.shape[1], dense_b.shape[1])
    dense_a, dense_b = (np.pad(d, ((0, 0), (0, experts - d.shape[1]))) for d in (dense_a, dense_b))
    return {
        ROUTING: module_error(
            dense_a, dense_b, bounds, names, f"activations/{module}:in{FIELD_MARK}routing"
        )
    }


def _caller(module: str, captured: dict) -> str:
    """The nearest enclosing module the capture holds (a list of layers is no call of its own),
    else the whole model."""
    while "." in module:
        module = module.rpartition(".")[0]
        if module in captured:
            return module
    return ROOT_MODULE


def _differing(ref: dict, other: dict, module: str, bounds: dict, names) -> dict:
    compared = compare_extra_inputs(ref, other, module, bounds, names) or {}
    return {what: e for what, e in compared.items() if not e["within"]}


def with_extra_inputs(
    found: dict | None, ref: dict, other: dict, bounds: dict, names: tuple[str, str]
) -> None:
    """A location whose first input agrees, checked on its other arguments: where one differs, the
    location moves up to the code that made it (the module docstring) and `entered_through` says
    which argument of which module, and by how much."""
    if (
        not found
        or not found.get("module")
        or not found.get("input_agrees")
        or not found.get("inputs_not_compared")
    ):
        return
    culprit = found["module"]
    compared = compare_extra_inputs(ref, other, culprit, bounds, names)
    if not compared:
        return
    # the routing rule takes every other argument of both sides; like for like, those it compared
    found["inputs_not_compared"] = (
        0 if ROUTING in compared else max(0, found["inputs_not_compared"] - len(compared))
    )
    differing = {what: e for what, e in compared.items() if not e["within"]}
    if not differing:
        return
    what, error = next(iter(differing.items()))  # the first in the call's order
    module = _caller(culprit, ref)
    while module != ROOT_MODULE and _differing(ref, other, module, bounds, names):
        module = _caller(module, ref)  # it was passed one too: made above
    found.update(module=module, entered_through={"module": culprit, "what": what, "error": error})

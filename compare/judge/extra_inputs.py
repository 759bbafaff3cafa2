"""A located module's arguments besides its first, set side by side where both captures kept them,
so that "its input agrees" is said of what was compared. Each capture keeps a module's other array
arguments of its first call, none larger than its first (`<module>:in#<position or keyword>`,
common/capture/activations.py FIELD_MARK).

Arrays of one shape under one key are compared as they are. One rule knows routing, where the two
sides pass it in other forms: a Mixture-of-Experts' experts called with (tokens, k) expert indices
and (tokens, k) weights (as Hugging Face's are) on one side, and with a dense (tokens, experts)
weight matrix (as a dense-dispatch port's are) on the other: the indices and weights are scattered
into the dense form and compared. Where they differ, the difference entered through them, so the
location moves up to the module that passed them (the experts' parent, the MoE block that routes)
and the report says so. Another argument that differs is said beside the location, which stays: one
key may hold one value in two conventions (a boolean mask, an additive one)."""

from __future__ import annotations

import numpy as np

from common.capture.activations import FIELD_MARK
from common.twin.modules import ROOT_MODULE
from compare.judge.tensor_error import module_error

ROUTING = "routing weights"


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


def compare_extra_inputs(
    ref: dict, other: dict, module: str, bounds: dict, names: tuple[str, str]
) -> dict | None:
    """{what: error} of `module`'s other arguments both sides kept, compared as the module docstring
    says; None when none could be set side by side."""
    a, b = _extras(ref, module), _extras(other, module)
    if not a or not b:
        return None
    found = {
        k: module_error(a[k], b[k], bounds, names, f"activations/{module}:in{FIELD_MARK}{k}")
        for k in a
        if k in b and a[k].shape == b[k].shape
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


def with_extra_inputs(
    found: dict | None, ref: dict, other: dict, bounds: dict, names: tuple[str, str]
) -> None:
    """A location whose first input agrees, checked on its other arguments: where the routing
    differs, the location moves to the module that passed it (its parent) and `entered_through` says
    which and by how much; where another differs, `other_input_differs` says so and the location
    stays."""
    if (
        not found
        or not found.get("module")
        or not found.get("input_agrees")
        or not found.get("inputs_not_compared")
    ):
        return
    compared = compare_extra_inputs(ref, other, found["module"], bounds, names)
    if not compared:
        return
    # the routing rule takes every other argument of both sides; one of
    # a shape under one key, that one
    found["inputs_not_compared"] = (
        0 if ROUTING in compared else max(0, found["inputs_not_compared"] - len(compared))
    )
    differing = {what: e for what, e in compared.items() if not e["within"]}
    if not differing:
        return
    what, error = next(iter(differing.items()))
    if what != ROUTING:
        found["other_input_differs"] = {"what": what, "error": error}
        return
    culprit = found["module"]
    parent = culprit.rpartition(".")[0] or ROOT_MODULE
    found.update(module=parent, entered_through={"module": culprit, "what": what, "error": error})

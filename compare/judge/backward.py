"""Where two ports part in step 0's backward pass, when their forwards agree.

A port whose forward agrees but whose backward differs (a custom autograd function, a stop-gradient
or a detach in the wrong place, a hand-written gradient) shows only as gradients that differ. Each
side's capture run also differentiates step 0's loss on the captured slice with respect to every
recorded module's input and output (zero probes added to each: torch_impl/capture.py,
jax_impl/capture.py). In the backward pass a module receives the gradient at its output and passes
back the gradient at its input once the backward of everything inside it has ended. Walking the
modules in the order their backward ends (the reverse of the order their forward started: a block's
layers before the block, the last layer first), the culprit is the first whose output gradient
agrees and whose input gradient does not: everything flowing into it agreed, what it passed back did
not. When the gradient the loss sends into the model (at the output of the module whose backward
runs first) already differs while the forwards agree, no module is the culprit: the two losses
differ (a user loss mis-ported, `in_loss`).
"""

from __future__ import annotations

import numpy as np

from common.files.tensor_summary import TensorSummary
from compare.judge.tensor_error import by_summary, module_error


def first_divergent_module_backward(
    ref: dict,
    other: dict,
    order: list[str],
    bounds: dict,
    names: tuple[str, str] = ("the reference", "the other side"),
    more_outputs: tuple[dict, dict] = ({}, {}),
) -> dict | None:
    """{step, module, in_loss, output_grad_agrees, input_grad_error, modules_compared,
    modules_diverging, other_roles} from the two sides' step-0 activation gradients (`order`: the
    reference's activation keys as captured, each module's input when it started, its output when it
    finished); None when a side has none. `module` None when every compared module's gradients
    agree. `more_outputs`: each side's {module: arrays it returned besides the captured first}; such
    a module whose captured output carries no gradient on that side while it does on the other (its
    caller reads another of its outputs) is left out (`other_roles`)."""
    if not ref or not other:
        return None
    position = {k: i for i, k in enumerate(order)}
    other_roles = sorted(
        k
        for k in order
        if not k.endswith(":in")
        and k in ref
        and k in other
        and _plays_no_part(k, (ref, other), more_outputs)
    )
    modules = sorted(
        (
            k
            for k in order
            if not k.endswith(":in") and k in ref and k in other and k not in other_roles
        ),
        # the order their backward ends
        key=lambda m: -position.get(f"{m}:in", position[m]),
    )
    if not modules:
        return None

    def error(key: str) -> dict | None:
        return (
            module_error(ref[key], other[key], bounds, names, f"activation_grads/{key}")
            if key in ref and key in other
            else None
        )

    into = {m: error(m) for m in modules}
    # None where a module's input has no gradient (token ids)
    back = {m: error(f"{m}:in") for m in modules}
    diverging = [
        m
        for m in modules
        if not into[m]["within"] or (back[m] is not None and not back[m]["within"])
    ]
    culprit = next((m for m in diverging if into[m]["within"]), None)
    in_loss = (
        culprit is None
        and bool(diverging)
        and diverging[0] == modules[0]
        and not into[modules[0]]["within"]
    )
    module = None if in_loss else culprit or (diverging[0] if diverging else None)
    return {
        "step": 0,
        "module": module,
        "in_loss": in_loss,
        "output_grad_agrees": culprit is not None,
        "input_grad_error": (back[module] if culprit else into[module])
        if module
        else into[modules[0]]
        if in_loss
        else None,
        "modules_compared": len(modules),
        "modules_diverging": len(diverging),
        "other_roles": other_roles,
        **by_summary([*into.values(), *back.values()]),
    }


def _plays_no_part(module: str, grads: tuple[dict, dict], more_outputs: tuple[dict, dict]) -> bool:
    """Whether the output captured of `module` (its first array) carries no gradient on a side where
    the module returned several, while it carries one on the other: the two capture outputs of other
    roles."""
    zero = [_all_zero(g[module]) for g in grads]
    return any(zero[i] and not zero[1 - i] and more_outputs[i].get(module) for i in (0, 1))


def _all_zero(value) -> bool:
    # kept as a summary (--tensors summary|auto): its largest magnitude
    if isinstance(value, TensorSummary):
        return value.stats["max_abs"] == 0 and not value.stats["nonfinite"]
    return not np.any(np.asarray(value))

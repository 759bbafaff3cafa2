"""The loss as the place two sides part (`in_loss`, said where the location would be).

A loss the model computes in its own forward (a twin's loss="model": transformers' CLIPModel given
`return_loss=True`, any Hugging Face model given labels): the whole model is then the module its
loss is the output of; where it is the only module that differs, its output is the loss (a scalar on
both sides) and the step-0 logits it returns agree, the sides part in the loss, not in the model.

A loss computed outside the model (the task's, a twin's own): where every module compared agrees,
forward and backward, and so do the step-0 logits, but the step-0 loss does not, the sides part in
the loss. (Where the gradient the loss sends back differs too, compare/judge/backward.py says so
first; from weights at which the loss's two forms send back nearly the same gradient, a trained
CLIP's symmetric and one-directional contrastive losses, only the loss's value shows it.)"""

from __future__ import annotations

from common.files.record import RunRecord
from common.twin.modules import ROOT_MODULE


def mark_own_loss(
    forward: dict | None, ref: RunRecord, tensors: dict, ref_activations: dict
) -> None:
    """Marks `forward` (first_divergent_module's result) `in_loss` with why, when the model's own
    loss is where the two sides part: every module but the whole model agrees, its output is the
    scalar loss, the logits agree."""
    if (
        not forward
        or forward["module"] != ROOT_MODULE
        or ref.extra.loss != "model"
        or forward["modules_diverging"] != 1
    ):
        return
    output = ref_activations.get(ROOT_MODULE)
    logits = tensors.get("outputs/logits")
    if output is None or tuple(output.shape) != () or not logits or not logits["within"]:
        return
    forward["in_loss"] = (
        "the model's own loss, computed in its forward (every module agrees, and so do the "
        "step-0 logits it returns; the loss does not)"
    )


def mark_loss_value(forward: dict | None, backward: dict | None, tensors: dict) -> None:
    """Marks `forward` `in_loss` when only the loss's value tells the sides apart: every module
    compared agrees forward and backward (none left uncompared), the step-0 logits agree, the step-0
    loss does not."""
    if (
        not forward
        or forward["module"] is not None
        or not forward["modules_compared"]
        or forward.get("not_compared")
        or forward.get("shapes_differ")
        or (backward and (backward["module"] or backward["in_loss"]))
    ):
        return
    loss, logits = tensors.get("outputs/loss"), tensors.get("outputs/logits")
    if not loss or loss["within"] or (logits and not logits["within"]):
        return
    forward["in_loss"] = (
        "the loss computed from the model's outputs (every module agrees, forward and backward, "
        "and so do the step-0 logits; the step-0 loss does not: the twin's loss or task)"
    )

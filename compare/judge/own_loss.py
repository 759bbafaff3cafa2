"""A loss the model computes in its own forward (a twin's loss="model": transformers' CLIPModel given
`return_loss=True`, any Hugging Face model given labels). The whole model is then the module its loss is the output
of: where it is the only module that differs, its output is the loss (a scalar on both sides) and the step-0 logits
it returns agree, the sides part in the loss, not in the model (`in_loss`, said where the location would be)."""
from __future__ import annotations

from common.files.record import RunRecord
from common.twin.modules import ROOT_MODULE


def mark_own_loss(forward: dict | None, ref: RunRecord, tensors: dict, ref_activations: dict) -> None:
    """Marks `forward` (first_divergent_module's result) `in_loss` with why, when the model's own loss is where the
    two sides part: every module but the whole model agrees, its output is the scalar loss, the logits agree."""
    if not forward or forward["module"] != ROOT_MODULE or ref.extra.loss != "model" \
            or forward["modules_diverging"] != 1:
        return
    output = ref_activations.get(ROOT_MODULE)
    logits = tensors.get("outputs/logits")
    if output is None or tuple(output.shape) != () or not logits or not logits["within"]:
        return
    forward["in_loss"] = ("the model's own loss, computed in its forward (every module agrees, and so do the "
                          "step-0 logits it returns; the loss does not)")

"""A likely cause for a loss that became NaN or Inf, from what the toolkit can see.

In order: the batch of that step held non-finite inputs (the data); the finite losses before it were
climbing (divergence: the learning rate, or no gradient clipping); a bfloat16 run whose loss was not
climbing (bf16 keeps float32's range but has an 8-bit mantissa: a sum or a softmax without its max
subtracted can overflow or lose everything); otherwise no cause the toolkit can see.
"""

from __future__ import annotations

import numpy as np

from common.data import make_dataset
from common.spec import RunSpec

CLIMB = 1.5  # the last finite loss over the first: a loss 50 % above where it started is diverging


def input_problem(spec: RunSpec, step: int) -> str | None:
    """The batch of `step` holds non-finite float inputs (None when it does not, or has integer
    inputs)."""
    batch = make_dataset(spec).global_batch(step)
    if np.issubdtype(batch.inputs.dtype, np.floating) and not np.all(np.isfinite(batch.inputs)):
        return (
            f"the batch of step {step} holds NaN or Inf inputs: clean the data "
            f"(data.path={spec.data.path})"
        )
    return None


def _own_loss(spec: RunSpec) -> str:
    """A twin's own loss, named first among the suspects: the user's code computes it."""
    from common.spec import TwinSpec

    if not isinstance(spec.model, TwinSpec):
        return ""
    from common.twin import twin_of

    loss = twin_of(spec.model).loss
    named = (
        "loss='model' (the forward's own)"
        if loss == "model"
        else f"the twin's own loss ({', '.join(f'{k}={v!r}' for k, v in loss.items())})"
        if loss
        else ""
    )
    return f"{named}, " if named else ""


def likely_cause(
    spec: RunSpec, losses: list[float | None], inputs_problem: str | None = None
) -> str:
    """Words for the record's message: what most likely made the loss non-finite, and what to
    change."""
    step = len(losses) - 1
    if inputs_problem:
        return inputs_problem
    finite = [x for x in losses if x is not None]
    train = spec.train
    if len(finite) >= 2 and finite[-1] > CLIMB * finite[0]:
        clip = "" if train.grad_clip else " and turn gradient clipping on (train.grad_clip=1.0)"
        return (
            f"the loss was diverging ({finite[0]:.4g} at step 0 -> {finite[-1]:.4g} at step "
            f"{step - 1}): "
            f"lower train.lr (now {train.lr:g}){clip}"
        )
    if train.dtype == "bfloat16":
        return (
            "the loss was not climbing, and the run computes in bfloat16 (float32's range, an "
            "8-bit "
            "mantissa): an overflow or a lost softmax maximum is likely; run it in float32 to "
            "confirm"
        )
    if step == 0:
        return (
            f"the very first loss is non-finite with finite inputs: {_own_loss(spec)}the model's "
            "forward (a "
            "log of 0, a division by 0) or its start weights"
        )
    return (
        "no cause the toolkit can see: the inputs were finite and the loss was not climbing; look "
        "for "
        "a log of 0 or a division by 0 in the model (JAX_DEBUG_NANS=1 stops JAX at the first NaN)"
    )

"""Which of a forward's outputs is the logits: a model returns a tensor, a tuple, a dict or a
Hugging Face `ModelOutput`, and the loss and the parity checks take the logits (numpy only,
duck-typed: it serves torch tensors and JAX arrays alike).

A forward that returns one array returns the logits. Among several outputs, the twin's `logits`
field names the one (a key or attribute, or a position); without it: the `logits` entry or
attribute, else the first element. A forward
whose chosen output is not an array is refused when the sides describe themselves, before any
training.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def _is_array(value) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def _pick(out, which):
    if isinstance(which, int):
        return (
            out[which] if isinstance(out, (tuple, list)) and -len(out) <= which < len(out) else None
        )
    if isinstance(out, Mapping):
        return out.get(which)
    return getattr(out, which, None)


def choose(out, which: str | int | None = None):
    """The logits among `out`, or None when there is none (`refusal` says why)."""
    if _is_array(out):  # one array: nothing to choose (the other side may return several)
        picked = out
    elif which is not None:
        picked = _pick(out, which)
    elif _pick(out, "logits") is not None:
        picked = _pick(out, "logits")
    else:
        picked = _pick(out, 0)
    return picked if _is_array(picked) else None


def logits_of(out, which: str | int | None = None):
    """The logits among `out`; TypeError (named: the twin's forward) when there is none."""
    picked = choose(out, which)
    if picked is None:
        raise TypeError(refusal(out, which))
    return picked


def refusal(out, which: str | int | None) -> str:
    """Why no logits can be taken from `out`, and the fix."""
    kind = type(out).__name__
    if which is not None:
        return (
            f"returns a {kind} whose output {which!r} is not an array; name the output that holds "
            "the logits "
            "(the twin's logits field: a key, an attribute or a position)"
        )
    keys = f" (entries: {', '.join(map(str, out))})" if isinstance(out, Mapping) else ""
    return (
        f"returns a {kind}{keys} with no array as itself, as its 'logits' or as its first "
        "element; name the "
        "output that holds the logits (the twin's logits field: a key, an attribute or a position)"
    )


class NoOwnLoss(TypeError):
    """A forward with loss='model' that returned no loss of its own."""


def own_loss(out):
    """The loss a forward returned itself (a Hugging Face model given `labels`:
    `ModelOutput.loss`)."""
    picked = _pick(out, "loss") if not _is_array(out) else None
    if not _is_array(picked) or len(picked.shape):
        raise NoOwnLoss(
            f"returns a {type(out).__name__} with no scalar 'loss' entry or attribute; the twin's "
            "loss='model' needs a forward that computes its own loss (give it the labels)"
        )
    return picked


def loss_refusal(value, side: str, twin) -> str:
    """Why the value a twin's own loss returned on step 0 cannot be trained on ('' when it can): a
    framework's float scalar, concrete or traced abstractly (jax.eval_shape). Found by the describe
    step, before anything trains: in the run it would be the backend's crash."""
    what = (
        "loss='model' (the forward's own loss)"
        if twin.loss == "model"
        else f"loss[{side!r}]={twin.loss[side]!r}"
    )
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return (
            f"{what} returns a {type(value).__name__}; a loss returns its framework's float scalar"
        )
    # jax.grad takes a scalar only; torch's backward any one-element tensor (a loss kept as shape
    # (1,) trains)
    if (len(shape) != 0) if side == "nnx" else math.prod(shape) != 1:
        return (
            f"{what} returns shape {tuple(shape)}; a loss returns a scalar (reduce it, e.g. "
            "with .mean())"
        )
    if "float" not in str(dtype):
        return f"{what} returns {dtype}; a loss returns a float scalar"
    return ""


# this process's side's constant keywords (common/twin/ Twin.forward_kwargs)
_FORWARD_KWARGS: dict = {}


def use_forward_kwargs(kwargs: Mapping) -> None:
    """The constant keywords every `forward` of this process passes from now on: set where a side's
    model is built (torch_impl/models.py, jax_impl/models.py), so that each forward of that side, in
    any runtime, takes them."""
    global _FORWARD_KWARGS
    _FORWARD_KWARGS = dict(kwargs)


def forward(model, inputs):
    """The forward on a batch's inputs: one array, or a twin's named arrays passed by name; and the
    twin's constant keywords (`use_forward_kwargs`)."""
    return (
        model(**inputs, **_FORWARD_KWARGS)
        if isinstance(inputs, Mapping)
        else model(inputs, **_FORWARD_KWARGS)
    )


def loss_batch(inputs, targets) -> dict:
    """The batch a loss is given: {"inputs", "targets"} of a built-in task, a twin's own named
    arrays whole."""
    return (
        {**inputs, **targets}
        if isinstance(inputs, Mapping)
        else {"inputs": inputs, "targets": targets}
    )


def array_outputs(out, which: str | int | None = None) -> dict:
    """Every array a forward returned, by name, to be compared at step 0: the logits (as `choose`
    picks them) as "logits", each other one by its key, attribute or position (a Hugging Face
    ModelOutput is a dict of its set fields); the loss is compared as the loss."""
    logits = logits_of(out, which)
    found = {"logits": logits}
    items = (
        out.items()
        if isinstance(out, Mapping)
        else enumerate(out)
        if isinstance(out, (tuple, list))
        else ()
    )
    for name, value in items:
        if _is_array(value) and value is not logits and str(name) not in ("logits", "loss"):
            found[str(name)] = value
    return found

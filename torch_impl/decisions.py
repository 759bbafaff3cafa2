"""The torch side's discrete choices at step 0 (common/capture/decisions.py): every top-k, argmax,
argmin, sort and argsort a forward calls, seen by a TorchFunctionMode (the function or the Tensor
method, wherever the model's code calls it), recorded with the module it ran in. Given another
side's decisions (`impose`), the i-th call returns that side's choice instead, its values gathered
from this side's own scores (so gradients flow as they would): the check that tells a port's
difference from a rounding-level flip of a tie."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from common.capture.decisions import Decision, oriented

# func -> (op, where its ranked axis is given: (position, keyword, default)); argmax/argmin's
# default None flattens
WATCHED = {}
for _op, _dim in (
    ("topk", (2, "dim", -1)),
    ("argmax", (1, "dim", None)),
    ("argmin", (1, "dim", None)),
    ("sort", (1, "dim", -1)),
    ("argsort", (1, "dim", -1)),
):
    WATCHED[getattr(torch, _op)] = WATCHED[getattr(torch.Tensor, _op)] = (_op, _dim)


def _arg(args, kwargs, position: int, keyword: str, default):
    return args[position] if len(args) > position else kwargs.get(keyword, default)


def _smallest(op: str, args, kwargs) -> bool:
    if op == "topk":
        return not _arg(args, kwargs, 3, "largest", True)
    if op in ("sort", "argsort"):
        return not _arg(args, kwargs, 2, "descending", False)
    return op == "argmin"


class DecisionWatch(TorchFunctionMode):
    """Records each watched call, `where()` naming the module it runs in; with `impose`, returns
    those choices instead of its own, in call order. The tensors stay on their device until
    `decisions()` brings them to the host (after a lazy runtime's one sync: torch_xla computes every
    copy in one graph)."""

    def __init__(self, where: Callable[[], str], to_numpy, impose: list[Decision] | None = None):
        super().__init__()
        self.where, self.to_numpy, self.impose, self.made = where, to_numpy, impose, []

    def decisions(self) -> list[Decision]:
        out = []
        for module, op, raw, scores, dim, smallest in self.made:
            indices, ranked = oriented(self.to_numpy(raw), self.to_numpy(scores), dim, smallest)
            out.append(Decision(module, op, indices, ranked))
        return out

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        watched = WATCHED.get(func)
        # a ranking of integers (a sort of expert ids to group tokens) is exact: no rounding can
        # flip it
        if watched is None or not (
            isinstance(args[0], torch.Tensor) and args[0].is_floating_point()
        ):
            return func(*args, **kwargs)
        op, (position, keyword, default) = watched
        scores, dim = args[0], _arg(args, kwargs, position, keyword, default)
        if dim is None:  # argmax/argmin over the flattened tensor
            out = func(*args, **kwargs)
            scores, dim, raw = scores.reshape(-1), 0, out.reshape(-1)
        else:
            dim = dim % scores.dim()
            keepdim = op in ("argmax", "argmin") and bool(_arg(args, kwargs, 2, "keepdim", False))
            imposed = self._imposed(op, scores, dim, keepdim)
            out = imposed if imposed is not None else func(*args, **kwargs)
            raw = out[1] if op in ("topk", "sort") else out
        self.made.append(
            (self.where(), op, raw.detach(), scores.detach(), dim, _smallest(op, args, kwargs))
        )
        return out

    def _imposed(self, op: str, scores: torch.Tensor, dim: int, keepdim: bool):
        """The call's result with the imposed choice, or None (nothing imposed, or a choice of
        another shape)."""
        if self.impose is None or len(self.made) >= len(self.impose):
            return None
        wanted = self.impose[len(self.made)]
        expected = list(scores.shape)
        expected.pop(dim)
        if wanted.op != op or list(wanted.indices.shape[:-1]) != expected:
            return None
        indices = torch.from_numpy(np.moveaxis(wanted.indices, -1, dim).copy()).to(scores.device)
        if op in ("argmax", "argmin"):
            return indices if keepdim else indices.squeeze(dim)
        if op == "argsort":
            return indices
        values = torch.gather(scores, dim, indices)
        return (
            torch.return_types.topk((values, indices))
            if op == "topk"
            else torch.return_types.sort((values, indices))
        )

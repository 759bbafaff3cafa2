"""torchax's op watch (common/ops.py): every aten op the step asks torchax's environment for,
counted, and those it has no lowering for, from torchax's own table (its Environment's lookup, the
one every dispatch makes: wrapped while the watch is on, restored after; the class's, so that the
watch starts no JAX backend before the run has set its devices)."""

from __future__ import annotations

import collections
import dataclasses

import torch
from torchax.tensor import Environment, OperatorNotFound

from common.ops import found

EMBEDDING = "aten::embedding"


class OpsWatch:
    def __init__(self):
        self.calls: collections.Counter = collections.Counter()
        self.missing: list[str] = []
        # the padding_idx each embedding call passed (common/runtime_behaviours.py)
        self.padding_idx: set[int] = set()
        # torchax 0.0.13: (env, func) -> its op, or raises
        self.lookup = Environment._get_op_or_decomp

    def __enter__(self):
        lookup = self.lookup

        def watched(env, func):
            # a torch function: torchax decomposes what it lacks
            if not isinstance(func, torch._ops.OpOverload):
                return lookup(env, func)
            name = func._schema.name
            self.calls[name] += 1
            try:
                op = lookup(env, func)
                return self._seen(op) if name == EMBEDDING else op
            except OperatorNotFound:
                if name not in self.missing:
                    self.missing.append(name)
                raise

        Environment._get_op_or_decomp = watched
        return self

    def _seen(self, op):
        """`op` (torchax's embedding), noting each call's padding_idx (-1: none)."""
        if not hasattr(op, "func"):
            return op
        lowering = op.func

        def noted(weight, indices, padding_idx=-1, *rest, **kwargs):
            if int(padding_idx) >= 0:
                self.padding_idx.add(int(padding_idx))
            return lowering(weight, indices, padding_idx, *rest, **kwargs)

        return dataclasses.replace(op, func=noted)

    def __exit__(self, *exc) -> None:
        Environment._get_op_or_decomp = self.lookup

    def found(self, error: BaseException | None) -> dict:
        met = (
            {"embedding-padding-idx": {"padding_idx": sorted(self.padding_idx)}}
            if self.padding_idx
            else {}
        )
        return found("torchax", self.calls, self.missing, {}, None, error, met)

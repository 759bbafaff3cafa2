"""torchax's op watch (common/ops.py): every aten op the step asks torchax's environment for,
counted, and those it has no lowering for, from torchax's own table (its Environment's lookup, the
one every dispatch makes: wrapped while the watch is on, restored after; the class's, so that the
watch starts no JAX backend before the run has set its devices)."""

from __future__ import annotations

import collections

import torch
from torchax.tensor import Environment, OperatorNotFound

from common.ops import found


class OpsWatch:
    def __init__(self):
        self.calls: collections.Counter = collections.Counter()
        self.missing: list[str] = []
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
                return lookup(env, func)
            except OperatorNotFound:
                if name not in self.missing:
                    self.missing.append(name)
                raise

        Environment._get_op_or_decomp = watched
        return self

    def __exit__(self, *exc) -> None:
        Environment._get_op_or_decomp = self.lookup

    def found(self, error: BaseException | None) -> dict:
        return found("torchax", self.calls, self.missing, {}, None, error)

"""torch_xla's op watch (common/ops.py): every aten op the step dispatches, counted by a
TorchDispatchMode (it sees each before torch_xla lowers it), the ops torch_xla ran as CPU fallbacks
with their calls, from its own metrics, and the op whose fallback raised (a CPU kernel that does not
take the tensor it was given)."""

from __future__ import annotations

import collections

import torch_xla.debug.metrics as met
from torch.utils._python_dispatch import TorchDispatchMode

from common.ops import found


class OpsWatch(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: collections.Counter = collections.Counter()
        self.failed_op: str | None = None

    def __enter__(self):
        met.clear_counters()  # the fallback counters of this step alone
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        self.calls[name] += 1
        try:
            return func(*args, **(kwargs or {}))
        except Exception:
            if self.failed_op is None and name in met.executed_fallback_ops():
                self.failed_op = name
            raise

    def found(self, error: BaseException | None) -> dict:
        fallbacks = {op: int(met.counter_value(op) or 0) for op in met.executed_fallback_ops()}
        return found(
            "torch_xla",
            self.calls,
            [],
            fallbacks,
            self.failed_op if error is not None else None,
            error,
        )

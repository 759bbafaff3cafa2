"""A float64 run's casts to float32 inside a torch model, made float64 (train.float32_casts=widen).

Hugging Face's code casts to float32 whatever the model's dtype (RMSNorm's variance, the rotary
tables' `.float()`, a softmax with dtype=torch.float32), so a float64 run of it is float32 there and
only float32's bounds can judge it (torch_impl/islands.py). Widened, the model computes in float64
end to end and float64's bounds apply. A function mode over the whole process (the run is float64
throughout, so no float32 is wanted anywhere) turns every cast to float32 into one to float64:
`.float()`, `.to(torch.float32)` / `.to(dtype=...)`, `.type(torch.float32)`, and any function given
dtype=torch.float32 (torch.arange, torch.zeros, softmax), counted per kind. Under torchax and
torch_xla the model's torch code is the same, and so is the mode. The twin of jax_impl/widen.py."""

from __future__ import annotations

import collections

import torch
from torch.overrides import TorchFunctionMode

_WIDENED: collections.Counter = collections.Counter()
_MODE: list = []  # the one mode pushed, once


class _WidenCasts(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", str(func))
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
            _WIDENED[f"{name}(dtype=float32)"] += 1
        elif name == "float" and args and isinstance(args[0], torch.Tensor):
            _WIDENED[".float()"] += 1
            return args[0].to(torch.float64)
        elif name in ("to", "type") and any(a is torch.float32 for a in args[1:]):
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            _WIDENED[f".{name}(float32)"] += 1
        return func(*args, **kwargs)


def widen_float32_casts() -> None:
    """From now on in this process, every cast to float32 is one to float64 (idempotent)."""
    if not _MODE:
        mode = _WidenCasts()
        mode.__enter__()
        _MODE.append(mode)


def stop_widening() -> None:
    """Casts to float32 as written again (a test's process; a run widens to its end)."""
    if _MODE:
        _MODE.pop().__exit__(None, None, None)


def widened() -> collections.Counter:
    """{cast: count} of the casts widened so far in this process (a copy)."""
    return collections.Counter(_WIDENED)


def widen_if_asked(spec) -> None:
    """Widen where the spec asks (train.widens_float32_casts), before the trainer is built: nothing
    of the model is traced or run yet."""
    if spec.train.widens_float32_casts:
        widen_float32_casts()

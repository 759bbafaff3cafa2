"""Float32 islands of a float64 run: the modules that compute in a narrower float on purpose.

Hugging Face's code casts to float32 in places (RMSNorm's variance, rotary tables, a softmax with
dtype=torch.float32), so a float64 run of it is float32 there, and its difference from a port is
float32's rounding, not a port error (compare/judge/islands.py judges those modules so). Found by
watching every aten op of one forward of step 0's batch (a TorchDispatchMode) while module hooks
keep the stack of modules running: an op whose floating output is narrower than float64 belongs to
the innermost module that maps to an NNX module (the root where none does). The twin of
jax_impl/islands.py (same function, same result).
"""

from __future__ import annotations

import re

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from common.spec import SpecError
from common.twin.modules import ROOT_MODULE
from common.twin.outputs import forward
from torch_impl.widen import widened

NARROW = (torch.float32, torch.float16, torch.bfloat16)
OPS_KEPT = 6  # op names listed per module
LOSS = "(loss)"  # where the loss's own ops compute narrower (a loss that casts to float32)


class _Watch(TorchDispatchMode):
    def __init__(self, stack: list[str], found: dict[str, dict[str, str]]):
        super().__init__()
        self.stack, self.found = stack, found

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        narrow = {
            t.dtype for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.dtype in NARROW
        }
        if narrow:
            ops = self.found.setdefault(self.stack[-1], {})
            name = func.overloadpacket.__name__
            if name not in ops and len(ops) < OPS_KEPT:
                ops[name] = str(min(narrow, key=lambda d: d.itemsize)).removeprefix("torch.")
        return out


def float32_islands(
    model: torch.nn.Module, inputs, names: dict[str, str], loss_of=None
) -> tuple[dict[str, str], dict[str, int]]:
    """{canonical module path: "float32: op, op, ..."} of the modules whose own ops compute in a
    float narrower than float64 in one no-grad eval-mode forward of `inputs` (`names`: torch module
    name -> canonical module path, torch_impl.convert.modules_to_canonical), and LOSS where
    `loss_of(output)` does; {} for a model that is float64 throughout."""
    stack, found, handles, training = [ROOT_MODULE], {}, [], model.training
    before = widened()
    for torch_name, module in model.named_modules():
        canonical = names.get(torch_name)
        if canonical is None:
            continue
        handles.append(
            module.register_forward_pre_hook(lambda *_, c=canonical: stack.append(c) and None)
        )
        # None: the output stays
        handles.append(module.register_forward_hook(lambda *_: stack.pop() and None))
    model.eval()  # no dropout draw, no running statistic moved: the run is not touched
    try:
        with torch.no_grad(), _Watch(stack, found):
            output = forward(model, inputs)
            if loss_of is not None:
                stack.append(LOSS)
                loss_of(output)
    except RuntimeError as e:
        if "dtype" not in str(e) and "Double" not in str(e):
            raise
        raise SpecError(
            f"train.dtype=float64: the torch model cannot compute in float64 as written: at module "
            f"{stack[-1]}, {str(e).splitlines()[0]}{_why_not_float64(str(e))}"
        ) from None
    finally:
        model.train(training)
        for handle in handles:
            handle.remove()
    return {module: _words(ops) for module, ops in found.items()}, dict(widened() - before)


# what torch says of an op that has no float64 kernel at all (grouped_mm: "Expected mat_a to be
# Float32, BFloat16 or Float16 matrix, got Double"; others: "not implemented for 'Double'")
NO_FLOAT64_KERNEL = re.compile(r"got Double|not implemented for 'Double'")


def _why_not_float64(error: str) -> str:
    """The cause and the fix: an op with no float64 kernel (Hugging Face's MoE experts run
    `grouped_mm` by default), or code that fixes float32 and feeds it to a float64 layer."""
    if NO_FLOAT64_KERNEL.search(error):
        return (
            " (an op with no float64 kernel: Hugging Face's MoE experts run grouped_mm by default; "
            "build the model with experts_implementation='eager', or another op that has one), "
            "or compare in float32"
        )
    return (
        " (its code fixes float32, e.g. torch.arange(..., dtype=torch.float32) or .float(), and "
        "feeds it to a float64 layer); make it follow its input's dtype (dtype=x.dtype), let the "
        "run widen such casts (train.float32_casts=widen, the default), or compare in float32"
    )


def host_tensors(inputs):
    """A batch's inputs (an array, or a twin's named arrays) as CPU tensors, integers as torch's
    int64."""
    if isinstance(inputs, dict):
        return {k: host_tensors(v) for k, v in inputs.items()}
    array = np.ascontiguousarray(inputs)
    return torch.from_numpy(array.astype(np.int64) if array.dtype.kind in "iu" else array)


def fresh_model_islands(
    spec, start: tuple, inputs, targets, loss_fn, loss_batch
) -> tuple[dict[str, str], dict[str, int]]:
    """float32_islands of a fresh CPU copy of the run's torch model at its start (`start`: its
    parameters and StartState, torch_impl/convert.py load_start), its loss
    `loss_fn(output, loss_batch(inputs, targets))` on CPU tensors (a runtime whose own model lives
    on a lazy device, where watching ops would build and compile graphs of the run's device)."""
    from torch_impl.convert import load_start, modules_to_canonical
    from torch_impl.models import build_model

    model = load_start(
        build_model(spec.model, spec.train.seed, spec.train.state_dtype), *start, spec.model
    )
    x, y = host_tensors(inputs), host_tensors(targets)
    names = modules_to_canonical(model, spec.model)
    return float32_islands(model, x, names, lambda out: loss_fn(out, loss_batch(x, y)))


def _words(ops: dict[str, str]) -> str:
    dtypes = sorted(set(ops.values()))
    return f"{', '.join(dtypes)}: {', '.join(ops)}"

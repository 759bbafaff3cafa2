"""`--provoke-recompile CAUSE@STEP`: recompiles provoked on purpose, one definition for every
backend.

From STEP on (each provocation holds to the end of the loop):
- input-shape: the first half of the global batch (a new batch shape);
- input-dtype: integer token ids in another width: int16 on the JAX runtimes (without x64 JAX has no
  int64; its embedding takes any integer), int64 on the torch runtimes (torch's embedding takes
  int32 or int64 only). Needs integer inputs (a language model);
- python-value: a Python number enters the loss as `loss + (0 * loss) ** value`, exactly the loss
  and its gradient: value 1.0 until STEP, then 1 + step, a new number every step. torch_xla bakes
  numbers into its graph (0 and 1 as constants; the exponent's derivative constants too); the JAX
  runtimes receive it as a static argument of the jitted step (a plain Python float argument would
  be traced as data and never recompile: JAX recompiles only where a number is static).
None of them changes what the model computes beyond the half batch of input-shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.data import Batch
from common.spec import RunSpec, SpecError
from common.vocab import PROVOKABLE, RecompileCause


@dataclass(frozen=True)
class Provocation:
    cause: RecompileCause
    step: int

    def __str__(self) -> str:
        return f"{self.cause}@{self.step}"


def parse_provocation(text: str) -> Provocation:
    cause, sep, step = text.partition("@")
    choices = ", ".join(PROVOKABLE)
    if not sep or cause not in PROVOKABLE or not step.isdigit() or int(step) < 1:
        raise SpecError(
            f"--provoke-recompile {text!r}: expected CAUSE@STEP with CAUSE one of {choices} and "
            "STEP >= 1, e.g. input-dtype@5"
        )
    return Provocation(RecompileCause(cause), int(step))


def check_provocations(provocations: list[Provocation], spec: RunSpec) -> None:
    """Refuse, in one line, a provocation this spec cannot take."""
    for p in provocations:
        if p.step >= spec.train.steps:
            raise SpecError(
                f"--provoke-recompile {p}: step {p.step} is not before "
                f"train.steps={spec.train.steps}"
            )
        if (
            p.cause in (RecompileCause.INPUT_SHAPE, RecompileCause.INPUT_DTYPE)
            and spec.task == "custom"
        ):
            raise SpecError(
                f"--provoke-recompile {p}: a twin's own batches (task custom) are fed as its batch "
                "source makes them; provoke python-value, or use a built-in task"
            )
        if p.cause == RecompileCause.INPUT_DTYPE and not spec.is_language_model:
            raise SpecError(
                f"--provoke-recompile {p}: input-dtype changes integer token ids; {spec.name} "
                "takes "
                "float inputs (use a language model such as gpt-tiny)"
            )
        if (
            p.cause == RecompileCause.INPUT_SHAPE
            and (spec.train.global_batch_size // 2) % spec.mesh.batch_replicas
        ):
            raise SpecError(
                f"--provoke-recompile {p}: half of train.global_batch_size="
                f"{spec.train.global_batch_size} does not divide over {spec.mesh.batch_replicas} "
                "data-parallel replicas"
            )


def _active(provocations: list[Provocation], cause: RecompileCause, step: int) -> bool:
    return any(p.cause == cause and step >= p.step for p in provocations)


def provoked_batch(batch: Batch, step: int, provocations: list[Provocation], int_dtype) -> Batch:
    """The batch of `step` as the active provocations change it (`int_dtype`: the runtime's other
    width)."""
    inputs, targets = batch.inputs, batch.targets
    # a twin's own named batch: provocations are refused for it (check_provocations)
    if isinstance(inputs, dict):
        return batch
    if _active(provocations, RecompileCause.INPUT_SHAPE, step):
        half = len(inputs) // 2
        inputs, targets = inputs[:half], targets[:half]
    if _active(provocations, RecompileCause.INPUT_DTYPE, step):
        inputs = inputs.astype(int_dtype)
    return Batch(np.ascontiguousarray(inputs), targets)


def python_value(step: int, provocations: list[Provocation], loop_steps: int) -> float | None:
    """The number the python-value provocation feeds `step`: None without one; 1.0 before its step
    (the term is in the program from the start, so the recompile is the number's alone); 1 + step
    from then on. The pipelined steps after the loop keep the last loop step's number (compiled
    already)."""
    if not any(p.cause == RecompileCause.PYTHON_VALUE for p in provocations):
        return None
    step = min(step, loop_steps - 1)
    return 1.0 + step if _active(provocations, RecompileCause.PYTHON_VALUE, step) else 1.0


def with_python_value(loss, value: float | None):
    """`loss + (0 * loss) ** value`: the same loss and gradient (value >= 1), any array type."""
    return loss if value is None else loss + (0 * loss) ** value

"""Whether a set of tensors fits a model (numpy only).

Every failure is a one-line CheckpointError naming the file and the tensors: missing ones,
unexpected ones, wrong shapes, all listed at once, so one fix makes the file load.
"""

from __future__ import annotations

import numpy as np

from common.weights import CONVERTED_DTYPES, PARAM_DTYPE, CheckpointError, check_param_dtype

# a torch side's described buffers (a full state_dict's), torch names
TORCH_BUFFERS = "torch_buffers.safetensors"
# converted to float32 once; anything else is refused
FLOAT_DTYPES = (PARAM_DTYPE, *CONVERTED_DTYPES)


def check_against(arrays: dict[str, np.ndarray], expected: dict[str, tuple], source: str) -> None:
    """The tensors must be exactly the model's, by name and shape."""
    missing = [f"{n} {list(s)}" for n, s in expected.items() if n not in arrays]
    extra = [f"{n} {list(np.shape(arrays[n]))}" for n in arrays if n not in expected]
    shapes = [
        f"{n} is {list(np.shape(arrays[n]))}, the model's is {list(s)}"
        for n, s in expected.items()
        if n in arrays and tuple(np.shape(arrays[n])) != tuple(s)
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensor(s) missing: {', '.join(missing)}")
    if extra:
        problems.append(f"{len(extra)} tensor(s) the model does not have: {', '.join(extra)}")
    if shapes:
        problems.append(f"{len(shapes)} shape(s) differ: {'; '.join(shapes)}")
    if problems:
        raise CheckpointError(
            f"{source} does not fit the model: {'; '.join(problems)} (a checkpoint of another "
            "architecture or size?)"
        )


def float32_of(name: str, dtype: str, source: str) -> None:
    """Refuse a tensor that is not floating point: the rule of every checkpoint
    (common.weights.check_param_dtype)."""
    check_param_dtype(name, dtype, source)

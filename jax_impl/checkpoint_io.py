"""Orbax checkpoints of the NNX model's parameter state (`nnx.state(model, nnx.Param)`, restored
with `nnx.update`), and what the JAX twin starts from: the twin of `torch_impl/checkpoint_io.py`
(same module and function names). Written with orbax-checkpoint's StandardCheckpointer into a
temporary directory moved into place (a reader never sees half a checkpoint), never over what the
user had (`common.data.targets`: a new or empty directory, or one of our checkpoints with
--overwrite). A directory that is not an orbax checkpoint of this model is one line; a write that
fails (disk full) is a common.data.targets.TargetWriteError.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from common.data.targets import checkpoint_dir
from common.files.fsutil import require_regular_file
from common.weights import CheckpointError

# where main says a failed write: fd 2, or a copy of it while orbax's threads are silenced
_STDERR = 2


@contextlib.contextmanager
def _quiet_stderr():
    """orbax's writer threads log a failed write (disk full) over and over with tracebacks, and go
    on after the save has failed: fd 2 stays silenced then, and main says the failure once, in one
    line."""
    global _STDERR
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    try:
        yield
    # a failed write (see save_orbax): its threads go on logging
    except (OSError, ValueError, RuntimeError):
        _STDERR = saved
        raise
    except BaseException:
        os.dup2(saved, 2)
        os.close(saved)
        raise
    os.dup2(saved, 2)
    os.close(saved)


def save_orbax(
    spec, canonical: dict, directory: Path, overwrite: bool = False, flag: str | None = None
) -> None:
    import orbax.checkpoint as ocp
    from flax import nnx

    from jax_impl import convert
    from jax_impl.models import build_model

    state = convert.load_canonical(
        nnx.state(build_model(spec.model), nnx.Param), canonical, spec.model
    )
    with checkpoint_dir(directory, overwrite, flag or f"--to-orbax {directory}") as tmp:
        try:
            with _quiet_stderr(), ocp.StandardCheckpointer() as checkpointer:
                checkpointer.save(tmp.resolve() / "state", state)
        # tensorstore's wrapping of a failed write (EFBIG, ENOSPC)
        except (OSError, ValueError, RuntimeError) as e:
            code = getattr(e, "errno", None) or next(
                map(int, re.findall(r"os_error_code='(\d+)'", str(e))), None
            )
            raise OSError(code, os.strerror(code) if code else str(e).splitlines()[0]) from None


def restore_orbax(spec, directory: Path) -> dict:
    """{canonical name: array}: the orbax state restored into the model's abstract state, then
    nnx.update."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from flax import nnx

    from jax_impl import convert
    from jax_impl.models import build_model

    # orbax would open a FIFO among them and wait forever
    for root, _, names in os.walk(directory / "state"):
        for name in names:
            require_regular_file(Path(root) / name, "orbax checkpoint file", CheckpointError)
    model = build_model(spec.model)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), nnx.state(model, nnx.Param)
    )
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            restored = checkpointer.restore(directory.resolve() / "state", abstract)
    except (FileNotFoundError, ValueError, KeyError, OSError) as e:
        raise CheckpointError(
            f"orbax checkpoint {directory} is not an orbax checkpoint of this model: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None
    nnx.update(model, restored)  # how a user restores it into their model
    return {k: np.asarray(v) for k, v in convert.to_canonical(nnx.state(model, nnx.Param)).items()}


def start_weights(spec, checkpoint) -> dict:
    """What the JAX twin starts from (canonical arrays): the canonical init or checkpoint, or an
    orbax one, moved as the spec says (common.weights.adjusted_start)."""
    from common.vocab import CheckpointFormat
    from common.weights import adjusted_start, start_params
    from common.weights.checkpoint_ref import CheckpointRef

    checkpoint = CheckpointRef.of(checkpoint)
    fmt, path = (checkpoint.format, checkpoint.path) if checkpoint else (None, None)
    if fmt in (None, CheckpointFormat.CANONICAL):
        return adjusted_start(start_params(spec.model, spec.train.seed, path), spec.train)
    if fmt == CheckpointFormat.ORBAX:
        return adjusted_start(restore_orbax(spec, path), spec.train)
    raise CheckpointError(
        f"--checkpoint {checkpoint}: the jax backend reads canonical and orbax checkpoints; a "
        f"{fmt} one is read by torch: pass it to python -m compare --checkpoint (converted once "
        "for every backend) or convert it with python -m compare.convert"
    )


def stderr_fd() -> int:
    """Where a failed write is said: fd 2, or a copy of it while orbax's failed writer threads stay
    silenced."""
    return _STDERR

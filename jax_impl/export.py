"""python -m jax_impl.export: the NNX side of `python -m compare.convert`, an orbax checkpoint of the NNX
model's parameter state (`nnx.state(model, nnx.Param)`, restored with `nnx.update`).

    --spec S --canonical IN.safetensors --to-orbax DIR     canonical weights -> orbax
    --spec S --orbax DIR --to-canonical OUT.safetensors    orbax -> canonical weights

Written with orbax-checkpoint's StandardCheckpointer into a temporary directory renamed into place (a
reader never sees half a checkpoint). A directory that is not an orbax checkpoint of this model is one
line and exit 2.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from common.cli import INPUT_ERRORS, fail
from common.presets import load_spec
from common.vocab import ExitCode
from common.weights import CheckpointError, load_checkpoint, save_checkpoint


def save_orbax(spec, canonical: dict, directory: Path) -> None:
    import orbax.checkpoint as ocp
    from flax import nnx

    from jax_impl import convert
    from jax_impl.models import build_model

    state = convert.load_canonical(nnx.state(build_model(spec.model), nnx.Param), canonical, spec.model)
    directory = directory.resolve()
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(tmp / "state", state)
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def restore_orbax(spec, directory: Path) -> dict:
    """{canonical name: array}: the orbax state restored into the model's abstract state, then nnx.update."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from flax import nnx

    from jax_impl import convert
    from jax_impl.models import build_model

    model = build_model(spec.model)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), nnx.state(model, nnx.Param))
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            restored = checkpointer.restore(directory.resolve() / "state", abstract)
    except (FileNotFoundError, ValueError, KeyError, OSError) as e:
        raise CheckpointError(f"orbax checkpoint {directory} is not an orbax checkpoint of this model: "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    nnx.update(model, restored)  # how a user restores it into their model
    return {k: np.asarray(v) for k, v in convert.to_canonical(nnx.state(model, nnx.Param)).items()}


def start_weights(spec, checkpoint) -> dict:
    """What the JAX twin starts from (canonical arrays): the canonical init or checkpoint, or an orbax one."""
    from common.checkpoints import parse_checkpoint
    from common.vocab import CheckpointFormat
    from common.weights import start_params

    fmt, path = parse_checkpoint(checkpoint) if checkpoint else (None, None)
    if fmt in (None, CheckpointFormat.CANONICAL):
        return start_params(spec.model, spec.train.seed, path)
    if fmt == CheckpointFormat.ORBAX:
        return restore_orbax(spec, path)
    raise CheckpointError(f"--checkpoint {checkpoint}: the jax backend reads canonical and orbax checkpoints; a "
                          f"{fmt} one is read by torch: pass it to python -m compare --checkpoint (converted once "
                          "for every backend) or convert it with python -m compare.convert")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jax_impl.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--canonical", type=Path)
    parser.add_argument("--to-orbax", type=Path)
    parser.add_argument("--orbax", type=Path)
    parser.add_argument("--to-canonical", type=Path)
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        if args.canonical and args.to_orbax:
            save_orbax(spec, load_checkpoint(args.canonical, spec.model), args.to_orbax)
        elif args.orbax and args.to_canonical:
            save_checkpoint(args.to_canonical, restore_orbax(spec, args.orbax))
        else:
            parser.error("give --canonical with --to-orbax, or --orbax with --to-canonical")
    except INPUT_ERRORS as e:
        fail(str(e), ExitCode.USAGE)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())

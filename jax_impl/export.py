"""python -m jax_impl.export: the NNX side of `python -m compare.convert`, an orbax checkpoint of
the NNX model's parameter state (`nnx.state(model, nnx.Param)`, restored with `nnx.update`).

    --spec S --canonical IN.safetensors --to-orbax DIR     canonical weights -> orbax
    --spec S --orbax DIR --to-canonical OUT.safetensors    orbax -> canonical weights

The checkpoints are jax_impl/checkpoint_io.py's. A directory that is not an orbax checkpoint of this
model is one line and exit 2; a write that fails (disk full) is one line and exit 7.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from common.cli import INPUT_ERRORS, Parser, fail
from common.data.targets import TargetWriteError, write_failed
from common.presets import load_spec
from common.procs import exit_process
from common.vocab import ExitCode
from common.weights import load_checkpoint, save_checkpoint
from jax_impl.checkpoint_io import restore_orbax, save_orbax, stderr_fd


def main(argv=None) -> int:
    parser = Parser(prog="python -m jax_impl.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--canonical", type=Path)
    parser.add_argument("--to-orbax", type=Path)
    parser.add_argument("--orbax", type=Path)
    parser.add_argument("--to-canonical", type=Path)
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a checkpoint this toolkit wrote"
    )
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        if args.canonical and args.to_orbax:
            save_orbax(
                spec, load_checkpoint(args.canonical, spec.model), args.to_orbax, args.overwrite
            )
        elif args.orbax and args.to_canonical:
            arrays = restore_orbax(spec, args.orbax)
            try:
                save_checkpoint(args.to_canonical, arrays)
            except OSError as e:
                raise write_failed(args.to_canonical, e) from None
        else:
            parser.error("give --canonical with --to-orbax, or --orbax with --to-canonical")
    except INPUT_ERRORS as e:
        fail(str(e), ExitCode.USAGE)
    except TargetWriteError as e:
        sys.stderr.flush()
        os.write(stderr_fd(), f"error: {e}\n".encode())
        # not sys.exit: orbax's failed writer threads would log tracebacks at shutdown
        os._exit(ExitCode.IO)
    return ExitCode.OK


if __name__ == "__main__":
    exit_process(main())

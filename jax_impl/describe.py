"""python -m jax_impl.describe --spec SPEC --out DIR: a twin's NNX side, before any training.

Writes `nnx_params.json` ({canonical name: shape}: the `nnx.state(model, nnx.Param)` paths, which are
the canonical tree). A factory that raises or returns something else than an nnx.Module is one line
and exit 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common.cli import INPUT_ERRORS, fail
from common.fsutil import write_json_atomic
from common.presets import load_spec
from common.vocab import ExitCode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jax_impl.describe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        from flax import nnx

        from jax_impl.convert import to_canonical
        from jax_impl.models import build_model

        params = to_canonical(nnx.state(build_model(spec.model, seed=spec.train.seed), nnx.Param))
    except INPUT_ERRORS as e:
        fail(str(e), ExitCode.USAGE)
    write_json_atomic(args.out / "nnx_params.json", {name: list(v.shape) for name, v in params.items()})
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())

"""python -m torch_impl.describe --spec SPEC --out DIR: a twin's torch side, before any training.

Writes `torch_params.json` ({parameter name: shape}, named_parameters order) and `torch_init.safetensors`
(the factory's own initialisation, seeded by train.seed, or with `--load` a torch or Hugging Face
checkpoint, checked against the model; torch names and layouts), from which compare derives the
correspondence and both sides' common start. A factory that raises or returns something
else than an nn.Module is one line and exit 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common.cli import INPUT_ERRORS, fail
from common.fsutil import write_json_atomic
from common.presets import load_spec
from common.vocab import ExitCode
from common.weights import save_checkpoint
from torch_impl.checkpoint_io import load_torch_side


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_impl.describe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--load", metavar="FORMAT:PATH", help="start from this torch or hf checkpoint instead")
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        from torch_impl.models import build_model

        model = build_model(spec.model, spec.train.seed)
        shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
        params = load_torch_side(args.load, spec, shapes) if args.load else \
            {name: p.detach().float().cpu().numpy() for name, p in model.named_parameters()}
    except INPUT_ERRORS as e:
        fail(str(e), ExitCode.USAGE)
    write_json_atomic(args.out / "torch_params.json", {name: list(shape) for name, shape in shapes.items()})
    save_checkpoint(args.out / "torch_init.safetensors", params)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())

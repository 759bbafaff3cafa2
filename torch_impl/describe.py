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
        params = load(args.load, spec, shapes) if args.load else \
            {name: p.detach().float().cpu().numpy() for name, p in model.named_parameters()}
    except INPUT_ERRORS as e:
        fail(str(e), ExitCode.USAGE)
    write_json_atomic(args.out / "torch_params.json", {name: list(shape) for name, shape in shapes.items()})
    save_checkpoint(args.out / "torch_init.safetensors", params)
    return ExitCode.OK


def load(ref: str, spec, shapes: dict[str, tuple]) -> dict:
    """A torch or hf checkpoint in the torch model's names, checked against its parameters."""
    from common import hf
    from common.checkpoints import check_against, parse_checkpoint
    from common.twin import twin_of
    from common.vocab import CheckpointFormat
    from torch_impl.checkpoint_io import load_hf, load_state

    fmt, path = parse_checkpoint(ref)
    if fmt == CheckpointFormat.HF:
        twin = twin_of(spec.model)
        hf.check_config(hf.read_config(path), spec.model, twin, f"hf checkpoint {path}")
        arrays = hf.to_torch_names(load_hf(path), twin, f"hf checkpoint {path}")
    else:
        arrays = load_state(path)
    check_against(arrays, shapes, f"{fmt} checkpoint {path}")
    return arrays


if __name__ == "__main__":
    sys.exit(main())

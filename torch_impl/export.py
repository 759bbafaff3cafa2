"""python -m torch_impl.export --spec S --canonical IN.safetensors --to OUT: the torch side of
`python -m compare.convert`: canonical weights loaded into the twin's torch model (through the
derived correspondence), its parameters written as a state_dict, `.pt` (torch.save) or
`.safetensors`, atomically, never over an existing file without --overwrite (`common.data.targets`);
a write that fails (disk full) is exit 7."""

from __future__ import annotations

import io
from pathlib import Path

from common.cli import INPUT_ERRORS, Parser, fail
from common.data.targets import TargetWriteError, file_target
from common.presets import load_spec
from common.procs import exit_process
from common.vocab import ExitCode
from common.weights import CheckpointError, load_checkpoint


def main(argv=None) -> int:
    parser = Parser(prog="python -m torch_impl.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--canonical", type=Path, required=True)
    parser.add_argument("--to", type=Path, required=True, help="a .pt or .safetensors file")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace the file --to if it exists"
    )
    args = parser.parse_args(argv)
    try:
        if args.to.suffix not in (".pt", ".pth", ".safetensors"):
            raise CheckpointError(
                f"{args.to}: a torch checkpoint is written as .pt, .pth or .safetensors"
            )
        spec = load_spec(args.spec)
        import torch

        from torch_impl.convert import load_canonical
        from torch_impl.models import build_model

        model = load_canonical(
            build_model(spec.model, spec.train.seed),
            load_checkpoint(args.canonical, spec.model),
            spec.model,
        )
        state = {name: p.detach().contiguous() for name, p in model.named_parameters()}
        if args.to.suffix == ".safetensors":
            from safetensors.torch import save

            data = save(state)
        else:
            buffer = io.BytesIO()
            torch.save(state, buffer)
            data = buffer.getvalue()
        with file_target(args.to, args.overwrite, f"--to {args.to}") as tmp:
            # a failed write is an OSError (EFBIG, ENOSPC), not a library's RuntimeError
            tmp.write_bytes(data)
    except INPUT_ERRORS as e:
        fail(str(e), ExitCode.USAGE)
    except TargetWriteError as e:
        fail(str(e), ExitCode.IO)
    return ExitCode.OK


if __name__ == "__main__":
    exit_process(main())

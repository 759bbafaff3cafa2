"""python -m compare.convert: carry a model's weights between formats, through the canonical one.

    python -m compare.convert --spec gpt-tiny --from torch:model.pt --to orbax:runs/gpt-orbax
    python -m compare.convert --twin examples/llama/twin.py:llama_tiny \
        --from hf:DIR --to torch:llama.pt
    python -m compare.convert --twin examples/llama/twin.py:llama_tiny \
        --from orbax:DIR --to torch:back.pt

Reads canonical, torch (.pt/.pth/.bin/.safetensors), hf and orbax; writes canonical, torch (.pt or
.safetensors) and orbax (an NNX `nnx.state(model, nnx.Param)` checkpoint that `nnx.update`
restores). Each side runs in its own interpreter (`--torch-python`, `--jax-python`), as in compare;
every step checks names and shapes, and round trips are bitwise. Bad input is one line and exit 2,
nothing written.

Never over what the user had (`common.data.targets`): a file target that exists, or a directory
target that is not new, empty or a checkpoint this toolkit wrote, is refused (exit 2); `--overwrite`
replaces a file, or a checkpoint of ours (only the entries it wrote). The new file or checkpoint is
written beside the target and moved into place; a write that fails (disk full) is exit 7 and leaves
the target as it was.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from common.cli import INPUT_ERRORS, Parser, SpecInputs, fail, resolve_spec
from common.data.targets import TargetWriteError, check_dir_target, check_file_target, file_target
from common.files.fsutil import write_json_atomic
from common.protocol import error_line
from common.vocab import CheckpointFormat, ExitCode
from common.weights import CheckpointError, load_checkpoint, save_checkpoint
from common.weights.checkpoint_ref import CheckpointRef
from compare.runs.orchestrate import backend_env
from compare.runs.prepare import INIT_FILE, prepare_start


def run_side(python: str, module: str, *args: str) -> None:
    proc = subprocess.run(
        [python, "-m", module, *args], capture_output=True, text=True, env=backend_env()
    )
    if proc.returncode == ExitCode.IO:
        raise TargetWriteError(error_line(proc.stderr) or f"{module} could not write its output")
    if proc.returncode != 0:
        raise CheckpointError(
            error_line(proc.stderr) or f"{module} exited with code {proc.returncode}"
        )


@dataclass(frozen=True)
class Conversion:
    """What one convert was asked, read once from its command line: the model (its spec inputs), the
    source and target checkpoints (FORMAT:PATH, as given and parsed), whether the target may be
    replaced, and each side's interpreter."""

    run: SpecInputs
    source: CheckpointRef
    target: CheckpointRef
    overwrite: bool
    torch_python: str
    jax_python: str
    timeout_s: float


def convert(conv: Conversion, tmp: Path) -> None:
    src_fmt, dst_fmt, dst = conv.source.format, conv.target.format, conv.target.path
    if dst_fmt == CheckpointFormat.HF:
        raise CheckpointError(
            f"--to {conv.target}: writing Hugging Face checkpoints is not supported; write torch: "
            "and load it into the HF model with load_state_dict"
        )
    if dst_fmt == CheckpointFormat.ORBAX:  # refused before anything is read or written
        check_dir_target(dst, conv.overwrite, f"--to {conv.target}")
    else:
        check_file_target(dst, conv.overwrite, f"--to {conv.target}")
    spec = resolve_spec(conv.run)
    from_torch_side = src_fmt in (
        CheckpointFormat.TORCH,
        CheckpointFormat.HF,
        CheckpointFormat.CANONICAL,
    )
    spec, folder, _ = prepare_start(
        spec,
        conv.source if from_torch_side else None,
        conv.torch_python,
        # a twin's canonical tree, the source canonical
        conv.jax_python,
        conv.timeout_s,
    )
    try:
        write(conv, spec, folder, tmp)
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


def write(conv: Conversion, spec, folder: Path | None, tmp: Path) -> None:
    src_fmt, src, dst_fmt, dst = (
        conv.source.format,
        conv.source.path,
        conv.target.format,
        conv.target.path,
    )
    spec_file = tmp / "spec.json"
    write_json_atomic(spec_file, spec.to_dict())
    if src_fmt == CheckpointFormat.ORBAX:
        canonical = tmp / "canonical.safetensors"
        run_side(
            conv.jax_python,
            "jax_impl.export",
            "--spec",
            str(spec_file),
            "--orbax",
            str(src),
            "--to-canonical",
            str(canonical),
        )
    else:
        canonical = folder / INIT_FILE if folder else src
    overwrite = ["--overwrite"] if conv.overwrite else []
    if dst_fmt == CheckpointFormat.CANONICAL:
        params = load_checkpoint(canonical, spec.model)
        with file_target(dst, conv.overwrite, f"--to {conv.target}") as out:
            save_checkpoint(out, params)
    elif dst_fmt == CheckpointFormat.TORCH:
        run_side(
            conv.torch_python,
            "torch_impl.export",
            "--spec",
            str(spec_file),
            "--canonical",
            str(canonical),
            "--to",
            str(dst),
            *overwrite,
        )
    else:
        run_side(
            conv.jax_python,
            "jax_impl.export",
            "--spec",
            str(spec_file),
            "--canonical",
            str(canonical),
            "--to-orbax",
            str(dst),
            *overwrite,
        )


def main(argv=None) -> int:
    parser = Parser(prog="python -m compare.convert", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="gpt-tiny", help="preset or spec file (default gpt-tiny)")
    parser.add_argument(
        "--twin", metavar="FILE_OR_MODULE:NAME", help="a user twin instead of --spec"
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE"
    )
    parser.add_argument("--from", dest="source", required=True, metavar="FORMAT:PATH")
    parser.add_argument("--to", dest="target", required=True, metavar="FORMAT:PATH")
    parser.add_argument("--torch-python", default=sys.executable)
    parser.add_argument("--jax-python", default=sys.executable)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the --to file, or the checkpoint of this toolkit in the --to directory",
    )
    args = parser.parse_args(argv)
    try:
        conv = Conversion(
            SpecInputs.of(args),
            CheckpointRef.parse(args.source),
            CheckpointRef.parse(args.target),
            args.overwrite,
            args.torch_python,
            args.jax_python,
            args.timeout,
        )
        with tempfile.TemporaryDirectory(prefix="xla-twins-convert-") as tmp:
            convert(conv, Path(tmp))
    except INPUT_ERRORS as e:
        fail(str(e), ExitCode.USAGE)
    except TargetWriteError as e:
        fail(str(e), ExitCode.IO)
    print(f"{args.source} -> {args.target}")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())

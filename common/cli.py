"""The command-line flags every backend shares (`python -m jax_impl` / `python -m torch_xla_impl`).

Exit codes are `common.vocab.ExitCode`, the same for `compare` and the backends.
"""
from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading
from pathlib import Path
from typing import NoReturn

from common.checkpoints import parse_checkpoint
from common.data import DataError
from common.presets import load_spec
from common.protocol import error_text
from common.provoke import Provocation, check_provocations, parse_provocation
from common.record import RecordError
from common.spec import RunSpec, SpecError
from common.tensor_file import BACKEND_TENSOR_MODES
from common.vocab import PROVOKABLE, ExitCode
from common.weights import CheckpointError

INPUT_ERRORS = (SpecError, DataError, CheckpointError, RecordError)


class Parser(argparse.ArgumentParser):
    """argparse with the toolkit's error form: one `error:` line and the hint to run --help, exit 2 (not
    argparse's usage block)."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see {self.prog} --help)", ExitCode.USAGE)


def parse_mesh(text: str) -> list[str]:
    """'data=2,tensor=4' -> ['mesh.data=2', 'mesh.tensor=4']."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in ("data", "fsdp", "tensor"):
            raise SpecError(f"--mesh {text!r}: each entry must be data=N, fsdp=N or tensor=N")
        out.append(f"mesh.{key}={value}")
    return out


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that define a run; `compare` passes them through to both backends."""
    parser.add_argument("--spec", default="gpt-tiny", help="preset name or .toml/.json spec file (default gpt-tiny)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override a spec field, e.g. --set model.d_model=128 (repeatable)")
    parser.add_argument("--steps", type=int, help="train steps (train.steps)")
    parser.add_argument("--mesh", help="mesh axis sizes, e.g. data=2,fsdp=1,tensor=4")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float64"), help="train.dtype")
    parser.add_argument("--seed", type=int, help="seed of parameter init and data (train.seed, data.seed)")
    add_provoke_flag(parser)


def provocation_arg(text: str) -> Provocation:
    try:
        return parse_provocation(text)
    except SpecError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"--provoke-recompile {text!r}: ")) from None


def add_provoke_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--provoke-recompile", dest="provoke", action="append", default=[], type=provocation_arg,
                        metavar="CAUSE@STEP", help="diagnostic: from STEP on, provoke a recompile of this cause ("
                        f"{', '.join(PROVOKABLE)}; repeatable) to see it named; see common/provoke.py")


MAX_PROFILE_STEPS = 1000  # each profiled step adds its trace to the XSpace file compare reads whole


def profile_steps(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_PROFILE_STEPS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of steps from 0 to {MAX_PROFILE_STEPS}")
    return int(text)


def add_profile_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", type=profile_steps, default=0, metavar="N",
                        help="after the run, N more steady steps under the framework's profiler: an XProf trace "
                             "in <run>/profile that xprof or TensorBoard opens (default 0: off, costs nothing)")


def add_no_hlo_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-hlo", action="store_true",
                        help="skip the compiled-program analysis (HLO dump, summary, memory): what "
                             "benchmarks.hlo_cost measures it costs")


def checkpoint_ref(text: str) -> str:
    """A backend's --checkpoint FORMAT:PATH, its format checked (each runtime reads what its framework can)."""
    try:
        parse_checkpoint(text)
    except CheckpointError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def backend_parser(backend: str) -> argparse.ArgumentParser:
    parser = Parser(prog=f"python -m {backend}", description=f"Train a spec with the {backend} twin "
                                     "and write a run record.")
    add_run_flags(parser)
    parser.add_argument("--out", type=Path, help="run directory (default runs/<backend>-<time>)")
    parser.add_argument("--parity", action="store_true",
                        help="also save step-0 outputs and gradients and the final parameters (canonical layout)")
    parser.add_argument("--tensors", choices=BACKEND_TENSOR_MODES, default="full",
                        help="with --parity: keep the parameter-sized tensors (gradients, final parameters and "
                             "state) whole (full), or as summaries: statistics and a fixed sample of their values "
                             "(common/summary.py), for models too large to keep twice on disk")
    parser.add_argument("--whole-tensors", type=lambda text: tuple(filter(None, text.split(","))), default=(),
                        metavar="KEY,...", help="with --tensors summary: keep these (e.g. grads/wte.embedding) whole "
                                                "(compare's second pass of --tensors auto)")
    parser.add_argument("--activations", action="store_true",
                        help="also save step 0's per-module inputs and outputs, which locate where two ports part "
                             "(compare asks for them when step 0 disagrees or with its own --activations)")
    parser.add_argument("--activations-only", action="store_true",
                        help="capture step 0's per-module inputs and outputs from the start weights and train "
                             "nothing (what compare runs to locate a divergence)")
    parser.add_argument("--checkpoint", type=checkpoint_ref, metavar="FORMAT:PATH",
                        help="start from these weights: canonical:PATH (or a bare path) on every backend; torch: "
                             "and hf: on the torch runtimes, orbax: on jax (compare --checkpoint converts any of "
                             "them once for every backend)")
    parser.add_argument("--compile-cache", type=Path, metavar="DIR",
                        help="the framework's persistent compile cache in DIR (default: off when run alone)")
    parser.add_argument("--throughput-steps", type=int, default=None,
                        help="extra steps timed pipelined (one wait at the end); default: train.steps, 0 = off")
    add_profile_flag(parser)
    add_no_hlo_flag(parser)
    parser.add_argument("--run-id", help="the compare run this backend run belongs to (compare sets it; it is "
                                          "written into the record so compare judges only its own run's records)")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks")
    return parser


def add_process_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of a multi-process run, the same on every backend whose row says `processes` (compare
    --processes passes them): jax.distributed's for jax and torchax, torch.distributed's for eager torch."""
    group = parser.add_argument_group("multi-process")
    group.add_argument("--coordinator", help="host:port of process 0, e.g. 127.0.0.1:12355")
    group.add_argument("--num-processes", type=int, default=1)
    group.add_argument("--process-id", type=int, default=0)


def spec_overrides(args: argparse.Namespace) -> list[str]:
    """--set first, then the dedicated flags (which win)."""
    out = list(args.overrides)
    if args.steps is not None:
        out.append(f"train.steps={args.steps}")
    if args.mesh:
        out += parse_mesh(args.mesh)
    if args.dtype:
        out.append(f"train.dtype={args.dtype}")
    if args.seed is not None:
        out += [f"train.seed={args.seed}", f"data.seed={args.seed}"]
    return out


def resolve_spec(args: argparse.Namespace) -> RunSpec:
    spec = load_spec(args.spec, spec_overrides(args), twin=getattr(args, "twin", None),
                     twin_timeout_s=getattr(args, "timeout", None))
    check_provocations(getattr(args, "provoke", []), spec)
    return spec


def fail(message: str, code: ExitCode) -> NoReturn:
    print(error_text(message), file=sys.stderr)
    sys.exit(int(code))


def exit_process(code: int) -> NoReturn:
    """End a framework process (a backend, a describe or export step) once its files are written: the exit
    hooks run (atexit: jax.distributed's shutdown, logging's flush), then the process ends without the
    interpreter's teardown, which frees every module's objects one by one and runs the frameworks'
    destructors for nothing the run needs (measured on gpt-tiny: torch_xla 0.8 s, torch 0.4 s, jax 0.17 s
    of compare's wall time). A thread still working keeps the normal exit, which waits for it."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()  # noqa: SLF001  (the hooks a normal exit runs first)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

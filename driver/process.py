"""The flags of a backend process: its parser (every flag compare passes it) and the flags of a
multi-process run (its end: common/procs.py exit_process)."""

from __future__ import annotations

import argparse
import difflib
from dataclasses import dataclass
from pathlib import Path

from common.cli import (
    MOST,
    Parser,
    add_no_hlo_flag,
    add_profile_flag,
    add_run_flags,
    bounded_int,
    checkpoint_ref,
)
from common.files.tensor_file import BACKEND_TENSOR_MODES, SUMMARIZED_GROUPS
from common.spec import RunSpec, SpecError
from common.weights import param_infos


def _row_token(text: str) -> tuple[int, int]:
    try:
        row, token = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not ROW,TOKEN (two integers, e.g. 3,0)"
        ) from None
    if row < 0 or token < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: row and token are counted from 0")
    return row, token


def add_capture_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of compare's extra runs of a backend: captures, op checks, behaviour-matched
    runs."""
    parser.add_argument(
        "--activations-only",
        action="store_true",
        help="capture step 0's per-module inputs and outputs from the start weights and train "
        "nothing (what compare runs to locate a divergence)",
    )
    parser.add_argument(
        "--capture-at",
        type=_row_token,
        default=(0, 0),
        metavar="ROW,TOKEN",
        help="with --activations-only: capture from this row of step 0's batch (and, of a language "
        "model, up to this token); compare passes where the two sides' logits differ most",
    )
    parser.add_argument(
        "--capture-step",
        type=bounded_int(0, MOST, "steps"),
        default=0,
        metavar="STEP",
        help="with --activations-only: train this many steps first and capture on that step's "
        "batch "
        "from the weights training left (compare's look at the choices of a step where two runs "
        "part after an agreeing step 0)",
    )
    parser.add_argument(
        "--impose-decisions",
        type=Path,
        metavar="RUN_DIR",
        help="with --activations-only: take the top-k, argmax and sort choices of that capture run "
        "instead of this side's own (compare's check of choices flipped at ties; "
        "common/capture/decisions.py)",
    )
    parser.add_argument(
        "--check-ops",
        action="store_true",
        help="with --activations-only: watch the ops of that one traced step and write what this "
        "runtime cannot lower or runs as CPU fallbacks into ops.json (compare's op check, before "
        "anything trains; common/ops.py)",
    )
    parser.add_argument(
        "--generate",
        type=bounded_int(0, MOST, "tokens"),
        default=0,
        metavar="N",
        help="run the twin's decode path from the start weights, training nothing: prefill prompts "
        "of different lengths (left-padded) and N greedy decode steps (common/generation.py)",
    )
    parser.add_argument(
        "--generate-tokens",
        type=Path,
        metavar="RUN_DIR",
        help="with --generate: feed the tokens that generation run chose (the reference's), "
        "recording this side's own choices beside them",
    )
    parser.add_argument(
        "--capture-decode-step",
        type=int,
        metavar="STEP",
        help="with --generate: capture every module's input and output in the call that makes "
        "that step's logits (0: the prefill), from the same arguments (compare's look at where "
        "two decode paths part)",
    )
    parser.add_argument(
        "--match-behaviours",
        type=lambda text: tuple(filter(None, text.split(","))),
        default=(),
        metavar="IDS",
        help="make these known behaviours of this runtime eager torch's for this run (compare's "
        "check of whether one explains a difference; common/runtime_behaviours.py)",
    )


def backend_parser(backend: str) -> argparse.ArgumentParser:
    parser = Parser(
        prog=f"python -m {backend}",
        description=f"Train a spec with the {backend} twin and write a run record.",
    )
    add_run_flags(parser)
    parser.add_argument("--out", type=Path, help="run directory (default runs/<backend>-<time>)")
    parser.add_argument(
        "--parity",
        action="store_true",
        help="also save step-0 outputs and gradients and the final parameters (canonical layout)",
    )
    parser.add_argument(
        "--tensors",
        choices=BACKEND_TENSOR_MODES,
        default="full",
        help="with --parity: keep the parameter-sized tensors (gradients, final parameters and "
        "state) whole (full), or as summaries: statistics and a fixed sample of their values "
        "(common/files/tensor_summary.py), for models too large to keep twice on disk",
    )
    parser.add_argument(
        "--whole-tensors",
        type=whole_tensor_keys,
        default=(),
        metavar="KEY,...",
        help="with --tensors summary: keep these (e.g. grads/wte.embedding) whole "
        "(compare's second pass of --tensors auto)",
    )
    parser.add_argument(
        "--activations",
        action="store_true",
        help="also save step 0's per-module inputs and outputs, which locate where two ports part "
        "(compare asks for them when step 0 disagrees or with its own --activations)",
    )
    add_capture_flags(parser)
    parser.add_argument(
        "--checkpoint",
        type=checkpoint_ref,
        metavar="FORMAT:PATH",
        help="start from these weights: canonical:PATH (or a bare path) on every backend; torch: "
        "and hf: on the torch runtimes, orbax: on jax (compare --checkpoint converts any of "
        "them once for every backend)",
    )
    parser.add_argument(
        "--compile-cache",
        type=Path,
        metavar="DIR",
        help="the framework's persistent compile cache in DIR (default: off when run alone)",
    )
    parser.add_argument(
        "--throughput-steps",
        type=bounded_int(0, MOST, "steps"),
        default=None,
        help="extra steps timed pipelined (one wait at the end); default: train.steps, at most 10; "
        "0 = off",
    )
    add_profile_flag(parser)
    add_no_hlo_flag(parser)
    parser.add_argument(
        "--run-id",
        help="the compare run this backend run belongs to (compare sets it; it is "
        "written into the record so compare judges only its own run's records)",
    )
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks")
    return parser


def whole_tensor_keys(text: str) -> tuple[str, ...]:
    """--whole-tensors' keys, each GROUP/NAME of a group a summary can stand for."""
    keys = tuple(filter(None, text.split(",")))
    for key in keys:
        group, sep, name = key.partition("/")
        if not (sep and name and group in SUMMARIZED_GROUPS):
            raise argparse.ArgumentTypeError(
                f"{key!r} is not GROUP/NAME with a group of {', '.join(SUMMARIZED_GROUPS)} "
                "(e.g. grads/wte.embedding)"
            )
    return keys


def check_whole_tensors(keys: tuple[str, ...], spec: RunSpec) -> None:
    """A gradient or parameter --whole-tensors names must be one of the model's (canonical names);
    nothing to check against where the spec does not list them (a twin run alone)."""
    names = list(param_infos(spec.model))
    for key in keys:
        group, _, name = key.partition("/")
        if names and group in ("grads", "params") and name not in names:
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.0)
            raise SpecError(
                f"--whole-tensors {key!r} names no parameter of this model"
                + (f" (closest {group}/{close[0]})" if close else "")
                + "; give the canonical names (nnx_params.json)"
            )


@dataclass(frozen=True)
class ProcessFlags:
    """This process's place in a multi-process run: a backend's own flags
    (driver.harness.RunOptions.own)."""

    coordinator: str | None = None  # host:port of process 0
    num_processes: int = 1
    process_id: int = 0


def add_process_flags(parser: argparse.ArgumentParser) -> type[ProcessFlags]:
    """The flags of a multi-process run, the same on every backend whose row says `processes`
    (compare --processes passes them): jax.distributed's for jax and torchax, torch.distributed's
    for eager torch. Returns the type that holds them."""
    group = parser.add_argument_group("multi-process")
    group.add_argument("--coordinator", help="host:port of process 0, e.g. 127.0.0.1:12355")
    group.add_argument("--num-processes", type=bounded_int(1, 4096, "processes"), default=1)
    group.add_argument("--process-id", type=bounded_int(0, 4095, "a process"), default=0)
    return ProcessFlags

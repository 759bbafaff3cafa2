"""The command-line flags every backend shares (`python -m jax_impl` / `python -m torch_xla_impl`).

Exit codes are `common.vocab.ExitCode`, the same for `compare` and the backends.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import NoReturn

from common.data import DataError
from common.files.record import RecordError
from common.presets import load_spec
from common.protocol import error_text
from common.provoke import Provocation, check_provocations, parse_provocation
from common.spec import AXES, RunSpec, SpecError
from common.vocab import PROVOKABLE, Bf16Mode, ExitCode, values
from common.weights import CheckpointError
from common.weights.checkpoint_ref import CheckpointRef

INPUT_ERRORS = (SpecError, DataError, CheckpointError, RecordError)


# the largest count an integer flag takes (steps, seeds' range aside): past it a value is a typo
MOST = 10**9


def bounded_int(low: int, high: int, what: str):
    """An integer flag's type: a whole number from `low` to `high`, else argparse's one line."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number{f' of {what}' if what else ''} from {low} to "
                f"{high}"
            )
        return value

    return parse


class Parser(argparse.ArgumentParser):
    """argparse with the toolkit's error form: one `error:` line and the hint to run --help, exit 2
    (not argparse's usage block)."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see {self.prog} --help)", ExitCode.USAGE)


def parse_mesh(text: str) -> list[str]:
    """'data=2,tensor=4' -> ['mesh.data=2', 'mesh.fsdp=1', 'mesh.tensor=4']: the whole mesh, an
    axis not named of size 1 (a spec's or a twin's own mesh is replaced, not merged)."""
    given = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in AXES:
            raise SpecError(f"--mesh {text!r}: each entry must be data=N, fsdp=N or tensor=N")
        given[key] = value
    return [f"mesh.{axis}={given.get(axis, 1)}" for axis in AXES]


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that define a run; `compare` passes them through to both backends."""
    parser.add_argument(
        "--spec", default="gpt-tiny", help="preset name or .toml/.json spec file (default gpt-tiny)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a spec field, e.g. --set model.d_model=128 (repeatable)",
    )
    parser.add_argument(
        "--steps", type=bounded_int(1, MOST, "steps"), help="train steps (train.steps)"
    )
    parser.add_argument(
        "--mesh", help="mesh axis sizes, e.g. data=2,tensor=4 (an axis not named: 1)"
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float64"), help="train.dtype")
    parser.add_argument(
        "--bf16",
        choices=values(Bf16Mode),
        help="a bfloat16 run's model: autocast over float32 weights, or loaded in bfloat16 as "
        "torch_dtype=torch.bfloat16 loads it (train.bf16_mode; default autocast)",
    )
    parser.add_argument(
        "--seed",
        type=bounded_int(0, 2**32 - 1, ""),
        help="seed of parameter init and data (train.seed, data.seed)",
    )
    add_provoke_flag(parser)


def provocation_arg(text: str) -> Provocation:
    try:
        return parse_provocation(text)
    except SpecError as e:
        raise argparse.ArgumentTypeError(
            str(e).removeprefix(f"--provoke-recompile {text!r}: ")
        ) from None


def add_provoke_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--provoke-recompile",
        dest="provoke",
        action="append",
        default=[],
        type=provocation_arg,
        metavar="CAUSE@STEP",
        help="diagnostic: from STEP on, provoke a recompile of this cause ("
        f"{', '.join(PROVOKABLE)}; repeatable) to see it named; see common/provoke.py",
    )


MAX_PROFILE_STEPS = 1000  # each profiled step adds its trace to the XSpace file compare reads whole


def profile_steps(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_PROFILE_STEPS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number of steps from 0 to {MAX_PROFILE_STEPS}"
        )
    return int(text)


def add_profile_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile",
        type=profile_steps,
        default=0,
        metavar="N",
        help="after the run, N more steady steps under the framework's profiler: an XProf trace "
        "in <run>/profile that xprof or TensorBoard opens (default 0: off, costs nothing)",
    )


def add_no_hlo_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-hlo",
        action="store_true",
        help="skip the compiled-program analysis (HLO dump, summary, memory): what "
        "benchmarks.hlo_cost measures it costs",
    )


def checkpoint_ref(text: str) -> CheckpointRef:
    """A backend's --checkpoint FORMAT:PATH, parsed once (each runtime reads what its framework
    can)."""
    try:
        return CheckpointRef.parse(text)
    except CheckpointError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


@dataclasses.dataclass(frozen=True)
class SpecInputs:
    """What a run's spec is resolved from: the spec (a preset or a file) or a twin, the `--set`
    overrides and the dedicated run flags (which win), and the provoked recompiles the spec must
    allow. Read once from a command line (`of`), by compare and by every backend."""

    spec: str = "gpt-tiny"
    overrides: tuple[str, ...] = ()
    steps: int | None = None
    mesh: str | None = None
    dtype: str | None = None
    bf16: str | None = None
    seed: int | None = None
    twin: str | None = None
    twin_timeout_s: float | None = None
    provoke: tuple[Provocation, ...] = ()

    @classmethod
    def of(cls, args: argparse.Namespace) -> SpecInputs:
        """The spec inputs of a parsed command line (a flag it lacks keeps its default)."""
        values = {
            "overrides": tuple(getattr(args, "overrides", ())),
            "provoke": tuple(getattr(args, "provoke", ())),
            "twin_timeout_s": getattr(args, "timeout", None),
        }
        for name in ("spec", "steps", "mesh", "dtype", "bf16", "seed", "twin"):
            if getattr(args, name, None) is not None:
                values[name] = getattr(args, name)
        return cls(**values)

    def overrides_applied(self) -> list[str]:
        """--set first, then the dedicated flags (which win)."""
        out = list(self.overrides)
        if self.steps is not None:
            out.append(f"train.steps={self.steps}")
        if self.mesh:
            out += parse_mesh(self.mesh)
        if self.dtype:
            out.append(f"train.dtype={self.dtype}")
        if self.bf16:
            out.append(f"train.bf16_mode={self.bf16}")
        if self.seed is not None:
            out += [f"train.seed={self.seed}", f"data.seed={self.seed}"]
        return out

    def path_read(self) -> Path | None:
        """The spec file this reads, if it reads one."""
        return Path(self.spec) if Path(self.spec).suffix in (".toml", ".json") else None


def resolve_spec(inputs: SpecInputs) -> RunSpec:
    spec = load_spec(
        inputs.spec,
        inputs.overrides_applied(),
        twin=inputs.twin,
        twin_timeout_s=inputs.twin_timeout_s,
    )
    check_provocations(list(inputs.provoke), spec)
    if inputs.bf16 and spec.train.dtype != "bfloat16":
        raise SpecError(
            f"--bf16 {inputs.bf16}: says how a bfloat16 run holds the model; this run is "
            f"{spec.train.dtype}: add --dtype bfloat16, or drop --bf16"
        )
    return spec


def fail(message: str, code: ExitCode) -> NoReturn:
    print(error_text(message), file=sys.stderr)
    ending = SystemExit(int(code))
    # for a caller that passes it on (compare/runs/meeting.py: a host tells host 0)
    ending.error = message
    raise ending

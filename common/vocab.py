"""The toolkit's vocabularies, each defined once: exit codes, statuses, phases, trace modes (the
backends themselves are rows of common/backends.py).

argparse `choices`, run records, report.json, the README and `docs/errors.md`
all use these members (a test checks that the docs list every one). Every
member carries its meaning, so the tables in the docs can be read against
`describe()`.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What `python -m compare` and `python -m <backend>` return."""

    OK = 0
    PARITY = 1
    USAGE = 2
    BACKEND = 3
    INTERRUPTED = 4
    NONFINITE = 5
    INTERNAL = 6
    IO = 7


EXIT_MEANINGS = {
    ExitCode.OK: "everything ran and parity passed (or the one backend asked for ran)",
    ExitCode.PARITY: "parity failed, the runs differ in a setting they should share, or "
    "--check-determinism found "
    "two identical runs differing",
    ExitCode.USAGE: "bad usage or input (the message names the field and the fix)",
    ExitCode.BACKEND: "a backend failed: crashed, killed by a signal, timed out, or its loss "
    "became NaN/Inf; the "
    "other backend is still reported",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C / SIGTERM): the running backend's process group is "
    "terminated",
    ExitCode.NONFINITE: "(a backend run alone) its loss became NaN/Inf; compare reports this as 3",
    ExitCode.INTERNAL: "an internal error of compare itself (a bug: report it with the --debug "
    "output)",
    ExitCode.IO: "results could not be written (disk full, or the run directory became "
    "unwritable); nothing "
    "half-written is left, and compare still reports the other backends",
}


class RecordStatus(enum.StrEnum):
    """How a backend's own run ended, as its record.json says."""

    OK = "ok"
    NONFINITE = "nonfinite"
    FAILED = "failed"


class BackendStatus(enum.StrEnum):
    """A backend's status in report.json: its record's status, or what compare saw of its
    process."""

    OK = "ok"
    NONFINITE = "nonfinite"
    FAILED = "failed"
    TIMEOUT = "timeout"
    USAGE_ERROR = "usage_error"
    INTERRUPTED = "interrupted"
    NOT_RUN = "not_run"
    IO_ERROR = "io_error"
    CANNOT_RUN = "cannot_run"


# errno values that mean the disk or the directory, not the program:
# such a failure exits ExitCode.IO
IO_ERRNOS = (28, 27, 122, 30, 13)  # ENOSPC, EFBIG, EDQUOT, EROFS, EACCES

BACKEND_STATUS_MEANINGS = {
    BackendStatus.OK: "ran to the end and wrote its record",
    BackendStatus.NONFINITE: "its loss became NaN/Inf; training stopped at that step",
    BackendStatus.FAILED: "crashed, was killed by a signal, or wrote no usable record",
    BackendStatus.TIMEOUT: "no result within --timeout; killed with its process group",
    BackendStatus.USAGE_ERROR: "refused its input (exit 2), e.g. a mesh its devices cannot hold",
    BackendStatus.INTERRUPTED: "running when compare was interrupted; its process group was "
    "terminated",
    BackendStatus.NOT_RUN: "not started because compare was interrupted before its turn",
    BackendStatus.IO_ERROR: "could not write its results (exit 7: disk full, or its directory "
    "became unwritable)",
    BackendStatus.CANNOT_RUN: "refused before any backend trained: one traced step found an op it "
    "has no lowering "
    "for, or a CPU fallback that fails (common/ops.py)",
}


class ReportStatus(enum.StrEnum):
    """The overall status of a comparison in report.json (with its exit code)."""

    OK = "ok"
    PARITY_FAILED = "parity_failed"
    NOT_COMPARABLE = "not_comparable"
    NONDETERMINISTIC = "nondeterministic"
    BACKEND_FAILED = "backend_failed"
    USAGE_ERROR = "usage_error"
    INTERRUPTED = "interrupted"
    # the verdict itself could not be made (a part of the report failed to build)
    INTERNAL_ERROR = "internal_error"


REPORT_STATUS_EXIT = {
    ReportStatus.OK: ExitCode.OK,
    ReportStatus.PARITY_FAILED: ExitCode.PARITY,
    ReportStatus.NOT_COMPARABLE: ExitCode.PARITY,
    ReportStatus.NONDETERMINISTIC: ExitCode.PARITY,
    ReportStatus.BACKEND_FAILED: ExitCode.BACKEND,
    ReportStatus.USAGE_ERROR: ExitCode.USAGE,
    ReportStatus.INTERRUPTED: ExitCode.INTERRUPTED,
    ReportStatus.INTERNAL_ERROR: ExitCode.INTERNAL,
}


class Phase(enum.StrEnum):
    """When a compile happened: before the first train step, or inside the loop."""

    SETUP = "setup"
    LOOP = "loop"


class TraceMode(enum.StrEnum):
    """How the torch_xla backend turns a train step into a graph."""

    LAZY = "lazy"
    COMPILE = "compile"
    DYNAMO = "dynamo"


TRACE_MODE_MEANINGS = {
    TraceMode.LAZY: "lazy tracing + torch_xla.sync() (the classic loop, default)",
    TraceMode.COMPILE: "the step inside torch_xla.compile(full_graph=True)",
    TraceMode.DYNAMO: "forward and loss under torch.compile(backend='openxla')",
}


class RecompileCause(enum.StrEnum):
    """Why a step recompiled, in one vocabulary for every backend (each framework's own words are
    kept beside it); the first three are also what `--provoke-recompile CAUSE@STEP` can provoke."""

    INPUT_SHAPE = "input-shape"
    INPUT_DTYPE = "input-dtype"
    PYTHON_VALUE = "python-value"
    NEW_PROGRAM = "new-program"
    UNKNOWN = "unknown"


RECOMPILE_CAUSE_MEANINGS = {
    RecompileCause.INPUT_SHAPE: "an input's shape changed",
    RecompileCause.INPUT_DTYPE: "an input's dtype changed",
    RecompileCause.PYTHON_VALUE: "a Python value that changed was traced into the step as a "
    "constant (a static "
    "argument, or a number the graph bakes in)",
    RecompileCause.NEW_PROGRAM: "the traced program itself changed (other ops: a new code path)",
    RecompileCause.UNKNOWN: "the framework gave no cause that names one of the above",
}
PROVOKABLE = (RecompileCause.INPUT_SHAPE, RecompileCause.INPUT_DTYPE, RecompileCause.PYTHON_VALUE)


class ParityMode(enum.StrEnum):
    """How `compare` judges parity (`--parity-mode`)."""

    DETERMINISTIC = "deterministic"
    EXACT = "exact"
    STATISTICAL = "statistical"


class MaskSource(enum.StrEnum):
    """Where a run's dropout masks come from (`train.dropout_masks`)."""

    FRAMEWORK = "framework"  # each framework's own generator, seeded by train.dropout_seed
    # drawn in numpy by common/data/masks.py and fed to the framework: the same on every backend
    COMMON = "common"


class Float32Casts(enum.StrEnum):
    """What a float64 run does with the model's own explicit casts to float32
    (`train.float32_casts`): Hugging Face's norms, rotary tables and softmax, flax's attention."""

    # made float64 on both sides (torch_impl/widen.py, jax_impl/widen.py): float64's bounds apply
    WIDEN = "widen"
    KEEP = "keep"  # computed as written: float32 islands, judged at float32's bounds from the first


class Bf16Mode(enum.StrEnum):
    """How a bfloat16 run holds the model (`train.bf16_mode`, `--bf16`): each is how users run
    bfloat16, and each has its own noise floor."""

    # float32 parameters and optimizer state, the forward in bfloat16: torch.autocast on the torch
    # side, the modules' compute dtype on NNX
    AUTOCAST = "autocast"
    # the model loaded in bfloat16, as Hugging Face's torch_dtype=torch.bfloat16 loads it: built
    # under torch's bfloat16 default (param_dtype=bfloat16 on NNX), so parameters, the buffers the
    # constructor makes in the default dtype, optimizer state and float inputs are bfloat16; the
    # loss is float32
    LOADED = "loaded"


BF16_MODE_WORDS = {
    Bf16Mode.AUTOCAST: "bfloat16 autocast over float32 weights and optimizer state",
    Bf16Mode.LOADED: "bfloat16 loaded (as torch_dtype=torch.bfloat16): weights, optimizer state "
    "and compute in bfloat16",
}


PARITY_MODE_MEANINGS = {
    ParityMode.DETERMINISTIC: "one run per backend, every tensor and step's loss within tolerance "
    "(runs without "
    "randomness; the default)",
    ParityMode.EXACT: "the deterministic check on runs with dropout: every backend multiplies by "
    "the same masks, "
    "drawn in common/data/masks.py from train.dropout_seed (slower; for debugging a port)",
    ParityMode.STATISTICAL: "K seeds per backend (--seeds), the per-seed mean losses paired by "
    "seed in a t-test "
    "(runs with dropout: each framework draws its own masks)",
}


class ProfileRange(enum.StrEnum):
    """The host annotations every backend puts in its `--profile` trace, so one reader splits every
    step: the step (what the loop's synced clock times), the framework call inside it (tracing,
    dispatch), the wait for the device, and the batch's transfer before it."""

    STEP = "xla-twins step"
    CALL = "xla-twins call"
    WAIT = "xla-twins wait"
    INPUT = "xla-twins input"


PROFILE_DIR = "profile"


class CheckpointFormat(enum.StrEnum):
    """What `--checkpoint FORMAT:PATH` reads (and `python -m compare.convert` writes)."""

    CANONICAL = "canonical"
    TORCH = "torch"
    HF = "hf"
    ORBAX = "orbax"


CHECKPOINT_FORMAT_MEANINGS = {
    CheckpointFormat.CANONICAL: "safetensors in the canonical (NNX) names and layouts: what the "
    "backends read",
    CheckpointFormat.TORCH: "a torch state_dict (.pt/.pth/.bin, loaded with weights_only=True, or "
    ".safetensors) "
    "in the torch model's names, mapped through the twin's correspondence",
    CheckpointFormat.HF: "a Hugging Face model directory (config.json + safetensors): GPT-2 onto "
    "the built-in gpt "
    "twin, Llama onto a twin that declares `hf` (examples/llama)",
    CheckpointFormat.ORBAX: "an orbax-checkpoint directory of the NNX model's parameter state "
    "(nnx.state / "
    "nnx.update restore it)",
}


def values(enum_cls) -> list[str]:
    """Member values, in definition order (argparse `choices`)."""
    return [m.value for m in enum_cls]

"""The backends compare can run: one row each, the one definition every other list derives from.

compare's `--backend` choices and per-backend flags (`--<name>-python`, `-set`, `-record` and any
flag a row passes through), which interpreter describes each side of a twin, whether a backend has
compiled programs to analyse, the benchmarks' maps and the house-rule tests all read these rows.

Adding a runtime is a row plus its package (`python -m <package>` calling
`driver.backend_main.main`). A row may also come from outside this repository: an installed
distribution that declares an entry point in the group `xla_twins.backends` naming a `BackendInfo`
(e.g. `[xla_twins.backends] torch_tpu = torch_tpu_impl.registry:ROW` in its entry_points.txt) is a
backend like the built-in ones. This module imports no framework: compare reads it in its own
process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from common.vocab import TRACE_MODE_MEANINGS, TraceMode, values

ENTRY_POINT_GROUP = "xla_twins.backends"
# which side of a twin a backend runs: the Flax NNX model or the torch.nn one
FAMILIES = ("nnx", "torch")
# what every other backend is judged against when it runs (else the first listed)
DEFAULT_REFERENCE = "jax"


@dataclass(frozen=True)
class Passthrough:
    """A compare flag forwarded to one backend as its own flag, e.g. `--torch-xla-mode` ->
    `--trace-mode`."""

    compare_flag: str
    backend_flag: str
    choices: tuple[str, ...]
    default: str
    help: str


@dataclass(frozen=True)
class BackendInfo:
    name: str  # --backend value, record.backend, report.json's key, the prefix of its compare flags
    package: str  # run as `python -m <package>`
    family: str  # one of FAMILIES
    compiles: bool  # has XLA programs: HLO, compile counts, recompile causes (eager torch has none)
    extra: str  # the pip extra that installs what it runs on
    meaning: str  # one line for --help, docs and tables
    # what its package may import besides common (tests/test_house_rules.py)
    frameworks: frozenset[str]
    in_both: bool = False  # part of `--backend both`, the default pair
    passthrough: tuple[Passthrough, ...] = ()
    # runs as several cooperating processes (compare --processes N): it takes --coordinator,
    # --num-processes and --process-id (common.cli.add_process_flags), and the process with id 0
    # writes the record
    processes: bool = False
    # float64 runs: the rtol per tensor kind this runtime's own lowerings need beyond float64's
    # rounding, and why (a pair with it is judged no tighter; the report says so); () where it
    # computes float64 as exactly as the others
    float64_rtol: tuple[tuple[str, float], ...] = ()
    float64_why: str = ""
    # the running variance its BatchNorm keeps: torch's is unbiased (n / (n - 1) times the batch's),
    # Flax's and torch_xla's biased; a pair that differs has running statistics 1/(n-1) apart, which
    # float64 would see
    running_var: str = "biased"
    # its step-0 capture can take another side's top-k/argmax/sort choices instead of its own
    # (--impose-decisions, common/capture/decisions.py): the check compare makes where every choice
    # that differs is a tie flipped by rounding
    imposes_decisions: bool = False
    # runs one traced step of a user twin under its op watch before any backend trains (--check-ops,
    # common/ops.py): a runtime that may lack a lowering, or fall back to the CPU, for an op the
    # model calls
    checks_ops: bool = False
    # its capture can follow training (--capture-step): it captures from the weights its steps left,
    # not from a fresh model of the start weights (torch_xla) or the
    # module torchax was given (torchax)
    captures_later_steps: bool = False
    # runs a twin's decode path (--generate, common/generation.py): prefill and greedy decode steps
    generates: bool = False
    # captures one call of its decode path module by module (--capture-decode-step): where two
    # decode paths part is named at a module
    captures_decode: bool = False
    # the modules its processes import first: compare's fork server for it imports them once, and
    # every process of the run on that backend starts from a fork of it (preload/); none: each
    # process imports its own; `?NAME`: imported where the interpreter has it
    preload: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        """The stem of its compare flags: `torch_xla` -> `torch-xla` (`--torch-xla-python`)."""
        return self.name.replace("_", "-")

    def check(self) -> BackendInfo:
        """A row from outside this repository, refused when a field cannot work."""
        problems = []
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            problems.append(f"name {self.name!r} is not a lowercase identifier")
        if self.family not in FAMILIES:
            problems.append(f"family {self.family!r} is not one of {', '.join(FAMILIES)}")
        if not re.fullmatch(r"[A-Za-z_][\w.]*", self.package):
            problems.append(f"package {self.package!r} is not a module name")
        if problems:
            raise ValueError(f"backend row {self.name!r}: {'; '.join(problems)}")
        return self


TRACE_MODE = Passthrough(
    "--torch-xla-mode",
    "--trace-mode",
    tuple(values(TraceMode)),
    TraceMode.LAZY.value,
    "how torch_xla turns the step into a graph: "
    + "; ".join(f"{m.value}: {meaning}" for m, meaning in TRACE_MODE_MEANINGS.items()),
)

DECODE_CACHE = Passthrough(
    "--torch-xla-decode-cache",
    "--decode-cache",
    ("static", "dynamic"),
    "static",
    "--generate: a Hugging Face model's cache on torch_xla: static (StaticCache: fixed shapes, "
    "its decode step compiles once) or dynamic (DynamicCache: it grows a token a step, a new "
    "graph each step, its recompiles counted)",
)

# what a backend's processes import first whatever the model (its fork server's, preload/); a
# Hugging Face model's HF_IMPORTS are added where the twin declares one (compare/runs/warm.py)
# (jaxlib's MLIR dialects: imported by JAX's first lowering, ~0.02 s of every process's, measured;
# internal to jaxlib, so optional, preload/server.py: another release may not have them)
JAX_IMPORTS = (
    "numpy",
    "jax",
    "jax.numpy",
    "flax.nnx",
    "optax",
    "?jaxlib.mlir.dialects.builtin",
    "?jaxlib.mlir.dialects.mhlo",
)
TORCH_IMPORTS = ("numpy", "torch", "torch._dynamo")
# what a fork server imports beside torch where the twin declares a Hugging Face model: compare's
# own servers (compare/runs/warm.py) import transformers' lazy top level alone, their run making
# one process per server in the common case, whose describe step waits for the server's imports
# (the model base in the server made a `--twin` llama_tiny compare ~1 s longer, measured)
HF_IMPORTS = ("transformers",)
# what every process that builds a Hugging Face model imports, whichever the model: every
# modeling_<name>.py imports the same base (PreTrainedModel, its GenerationMixin, the layers, the
# model registry), ~1 CPU-s a process (transformers 5.23, measured); the model's own module
# ~0.01-0.15 s after it. The suite's servers, serving ~1,500 processes, import it
# (tests/preloaded.py)
HF_MODEL_BASE = (
    *HF_IMPORTS,
    "transformers.models",
    "transformers.modeling_utils",
    "transformers.modeling_layers",
    "transformers.generation.utils",
)

BUILT_IN = (
    BackendInfo(
        "jax",
        "jax_impl",
        "nnx",
        True,
        "jax",
        "the Flax NNX twin on JAX (jax_impl)",
        frozenset({"jax", "jaxlib", "flax", "optax"}),
        in_both=True,
        processes=True,
        captures_later_steps=True,
        generates=True,
        captures_decode=True,
        preload=JAX_IMPORTS,
    ),
    BackendInfo(
        "torch",
        "torch_impl",
        "torch",
        False,
        "torch-xla",
        "the torch.nn twin in eager PyTorch, CPU or CUDA: the ground truth of the PyTorch side "
        "(torch_impl)",
        frozenset({"torch"}),
        processes=True,
        running_var="unbiased",
        imposes_decisions=True,
        captures_later_steps=True,
        generates=True,
        captures_decode=True,
        preload=TORCH_IMPORTS,
    ),
    BackendInfo(
        "torch_xla",
        "torch_xla_impl",
        "torch",
        True,
        "torch-xla",
        "the same torch.nn twin on PyTorch/XLA (torch_xla_impl)",
        frozenset({"torch_impl", "torch", "torch_xla"}),
        in_both=True,
        passthrough=(TRACE_MODE, DECODE_CACHE),
        checks_ops=True,
        generates=True,
        # measured on gpt-tiny (docs/findings.md): step-0 gradients up to 6.4e-9 relative, final
        # parameters after 50 steps 1.3e-6, where JAX, eager torch and torchax agree to ~1e-14; on
        # HF's Gemma2 (tanh GELU) computing in float64 end to end (its float32 casts widened),
        # 1.6e-5 in 0.013 % of the parameters after 3 AdamW steps (an update near eps moved)
        float64_rtol=(("forward", 3e-8), ("grad", 3e-8), ("loss", 1e-8), ("params", 1e-4)),
        float64_why="torch_xla 2.9 lowers GELU with constants rounded to float32 (4.5e-10 "
        "relative at the "
        "op, exact erf and tanh)",
        # its environment (debug level, XLA's dump folder and flags, the CPU device count) is read
        # when its runtime starts, not at import (measured: each set after `import torch_xla` takes
        # effect)
        preload=(
            *TORCH_IMPORTS,
            "jax",
            "jax.numpy",
            "torch_xla",
            "torch_xla.core.xla_model",
            "torch_xla.runtime",
            "torch_xla.distributed.spmd",
            "torch_xla.distributed.parallel_loader",
            "torch_xla.debug.metrics",
        ),
    ),
    # torchax runs torch_impl's models on JAX, sharing the JAX twin's plain-JAX modules
    BackendInfo(
        "torchax",
        "torchax_impl",
        "torch",
        True,
        "torchax",
        "the same torch.nn twin on JAX through torchax (torchax_impl)",
        frozenset({"torch_impl", "jax_impl", "torch", "jax", "optax", "torchax"}),
        processes=True,
        running_var="unbiased",
        checks_ops=True,
        generates=True,
        preload=(
            *JAX_IMPORTS,
            *TORCH_IMPORTS,
            "torch.fx.experimental.symbolic_shapes",
            "torchax",
        ),
    ),
)


@cache
def _installed() -> tuple[BackendInfo, ...]:
    """Rows declared by installed distributions (entry points), read once and only when asked
    for."""
    from importlib.metadata import entry_points

    rows = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        row = point.load()
        if not isinstance(row, BackendInfo):
            raise ValueError(
                f"entry point {point.name} = {point.value} in group {ENTRY_POINT_GROUP} is a "
                f"{type(row).__name__}, not a common.backends.BackendInfo"
            )
        rows.append(row.check())
    return tuple(rows)


@cache
def registry() -> dict[str, BackendInfo]:
    """Every backend by name, built-in ones first, in the order `--backend all` runs them."""
    rows = {}
    for row in (*BUILT_IN, *_installed()):
        if row.name in rows or row.package in {r.package for r in rows.values()}:
            raise ValueError(
                f"backend {row.name!r} ({row.package}) is registered twice; uninstall one of them"
            )
        rows[row.name] = row
    return rows


def names() -> list[str]:
    return list(registry())


def info(name: str) -> BackendInfo:
    return registry()[name]


def of_package(package: str) -> BackendInfo:
    """The row of the backend `python -m <package>` runs (a backend's driver learns its name
    here)."""
    for row in BUILT_IN:  # no entry-point scan for the built-in backends
        if row.package == package:
            return row
    return next(r for r in registry().values() if r.package == package)


def packages() -> list[str]:
    return [r.package for r in registry().values()]

"""What each backend process is given: one spec file, its only spec input, and the flags that say
how to run.

compare resolves every backend's spec here (`side_spec`), from the run's spec (a preset, a spec
file, or the start prepared for a twin or a checkpoint) with the overrides of both sides and of its
own (`--<name>-set`): once before the preparation and once after it (compare/options.py
`with_specs`); each launch changes only run settings of it (steps, dtype, seed, start jitter), and
`run_backend` writes it into the backend's run directory as `spec.json`
(common.files.record.SPEC_FILE) before the backend starts: a twin reaches a backend as data (its
canonical tree and layouts filled in), never as flags to resolve again. The flags carry no spec:
parity tensors, activations, the start checkpoint, the compile cache, profile, HLO, provoked
recompiles, the run id and what a registry row passes through.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from common import backends
from common.cli import resolve_spec
from common.spec import RunSpec, TwinSpec
from common.spec.parse import apply_overrides
from compare.judge.noise_floor import JITTER_ULPS
from compare.options import CompareOptions, Group
from compare.runs.cache import backend_cache_dir


@dataclass(frozen=True)
class Launch:
    """One backend run: the spec it runs, its flags and the processes that run it."""

    spec: RunSpec
    flags: tuple[str, ...]
    group: Group = Group()


def side_spec(opts: CompareOptions, name: str) -> RunSpec:
    """The spec `name` runs: the run's, with every override and its side's (derived once before a
    twin is prepared and once after: CompareOptions.with_specs; each launch below changes only run
    settings of it)."""
    return resolve_spec(opts.side_inputs(name))


def _changed(spec: RunSpec, *overrides: str) -> RunSpec:
    return apply_overrides(spec, list(overrides)).validate()


def _flags(
    opts: CompareOptions, name: str, *, quiet: bool = False, provoke: bool = True
) -> list[str]:
    """The flags of a launch; `quiet`: no profile and no HLO (an extra run, whose timings nobody
    reads); `provoke`: with the provoked recompiles."""
    flags = (
        [
            a
            for provocation in opts.capture.provoke
            for a in ("--provoke-recompile", str(provocation))
        ]
        if provoke
        else []
    )
    if opts.checkpoint:
        flags += ["--checkpoint", str(opts.checkpoint)]
    for backend_flag, value in opts.side(name).passthrough:
        flags += [backend_flag, value]
    if opts.capture.compile_cache:
        flags += ["--compile-cache", str(backend_cache_dir(opts.capture.compile_cache, name))]
    if opts.capture.profile and not quiet:
        flags += ["--profile", str(opts.capture.profile)]
    if quiet or not opts.capture.hlo:
        flags.append("--no-hlo")
    # --tensors auto: the backends keep summaries, compare's second pass what it needs whole
    # (compare/runs/second_pass.py)
    tensors = opts.capture.tensors
    return flags + [
        "--tensors",
        "summary" if tensors == "auto" else tensors,
        "--run-id",
        opts.output.run_id,
    ]


def main_launch(opts: CompareOptions, name: str) -> Launch:
    """The run itself: every step, with the parity tensors (and step 0's activations with
    --activations)."""
    return Launch(
        opts.spec_of(name),
        (*_flags(opts, name), "--parity", *(["--activations"] * opts.capture.activations)),
        opts.hosts,
    )


def capture_launch(
    opts: CompareOptions,
    name: str,
    whole: tuple[str, ...] = (),
    impose: Path | None = None,
    at: tuple[int, int] = (0, 0),
    step: int = 0,
) -> Launch:
    """Step 0's activations from the start weights, nothing trained (compare/runs/capture_runs.py):
    no parity tensors, provoked recompiles, HLO, profile or throughput; one process (its slice of
    step 0 is one example). `whole`: activation keys kept whole under summaries (a location's
    confirming capture, compare/runs/extra_runs.py); `impose`: the run directory whose decisions
    this capture takes instead of its own (compare/judge/decided.py); `at`: the (row, token) of step
    0's batch it captures from (compare/runs/capture_runs.py worst_example); `step`: the choices of
    that later step instead, after the run's own steps before it (its spec's schedule unchanged)."""
    if step:
        return Launch(
            opts.spec_of(name),
            (
                *_flags(opts, name, quiet=True, provoke=False),
                "--activations-only",
                "--capture-step",
                str(step),
            ),
        )
    kept = ("--whole-tensors", ",".join(whole)) if whole else ()
    imposed = ("--impose-decisions", str(impose)) if impose else ()
    where = ("--capture-at", f"{at[0]},{at[1]}") if tuple(at) != (0, 0) else ()
    return Launch(
        _changed(opts.spec_of(name), "train.steps=1"),
        (
            *_flags(opts, name, quiet=True, provoke=False),
            "--activations-only",
            *kept,
            *imposed,
            *where,
        ),
    )


def floor_launch(opts: CompareOptions, name: str, dtype: str) -> Launch:
    """A backend's noise-floor run (compare/judge/noise_floor.py), with the parity tensors (no HLO,
    profile or throughput): of a bfloat16 comparison, the same spec, start and batches in float32;
    of a float32 one, the same from start weights JITTER_ULPS off (train.start_jitter_ulps)."""
    change = (
        "train.dtype=float32" if dtype == "bfloat16" else f"train.start_jitter_ulps={JITTER_ULPS}"
    )
    return Launch(
        _changed(opts.spec_of(name), change),
        (*_flags(opts, name, quiet=True, provoke=False), "--parity", "--throughput-steps", "0"),
        opts.hosts,
    )


def kernel_launch(opts: CompareOptions, name: str, arg: str, reference: str, dtype: str) -> Launch:
    """A kernel side's run with its kernel switch `arg` set to the `reference` op, in `dtype`
    (compare/judge/kernels.py): the same spec, start and batches, with the parity tensors and, with
    --activations, step 0's activations (no HLO, profile or throughput)."""
    return Launch(
        _changed(opts.spec_of(name), f"model.{arg}={reference}", f"train.dtype={dtype}"),
        (
            *_flags(opts, name, quiet=True, provoke=False),
            "--parity",
            "--throughput-steps",
            "0",
            *(["--activations"] * opts.capture.activations),
        ),
        opts.hosts,
    )


def matched_launch(opts: CompareOptions, name: str, behaviours: list[str]) -> Launch:
    """A backend's run once more with these known behaviours of its runtime made eager torch's
    (common/runtime_behaviours.py): the same spec, start and batches, with the parity tensors (no
    HLO, profile or throughput)."""
    return Launch(
        opts.spec_of(name),
        (
            *_flags(opts, name, quiet=True, provoke=False),
            "--parity",
            "--throughput-steps",
            "0",
            "--match-behaviours",
            ",".join(behaviours),
        ),
        opts.hosts,
    )


def whole_launch(
    opts: CompareOptions, name: str, keys: list[str], floor_dtype: str | None = None
) -> Launch:
    """--tensors auto's second pass (compare/runs/second_pass.py) of a main run, or of a noise-floor
    run of `floor_dtype`: the same spec, start and batches, so the same values, keeping `keys` whole
    (no HLO, profile, throughput or activations, which change no value)."""
    if floor_dtype:
        base = floor_launch(opts, name, floor_dtype)
    else:
        base = Launch(
            opts.spec_of(name),
            (*_flags(opts, name, quiet=True), "--parity", "--throughput-steps", "0"),
            opts.hosts,
        )
    return Launch(base.spec, (*base.flags, "--whole-tensors", ",".join(keys)), base.group)


def generate_launch(
    opts: CompareOptions,
    name: str,
    fed_from: Path | None = None,
    floor: bool = False,
    capture_step: int | None = None,
) -> Launch:
    """A backend's generation run (common/generation.py): prefill and --generate N greedy decode
    steps from the start weights, nothing trained (no parity tensors, HLO, profile or throughput);
    fed the tokens of the generation run in `fed_from` (the reference's); `floor`: in float32, a
    bfloat16 run's noise floor; `capture_step`: the call making that step's logits captured module
    by module."""
    fed = ("--generate-tokens", str(fed_from)) if fed_from else ()
    fed += ("--capture-decode-step", str(capture_step)) if capture_step is not None else ()
    change = ("train.dtype=float32",) if floor else ()
    return Launch(
        _changed(opts.spec_of(name), "train.steps=1", *change),
        (
            *_flags(opts, name, quiet=True, provoke=False),
            "--generate",
            str(opts.capture.generate),
            *fed,
        ),
    )


def seed_launch(opts: CompareOptions, name: str, seed: int) -> Launch:
    """A statistical mode's extra seed run: the losses only (no parity tensors, HLO, profile,
    throughput)."""
    return Launch(
        _changed(opts.spec_of(name), f"train.seed={seed}", f"data.seed={seed}"),
        (*_flags(opts, name, quiet=True), "--throughput-steps", "0"),
        opts.hosts,
    )


def op_check_launches(opts: CompareOptions) -> dict[str, Launch]:
    """The op checks a run makes before any backend trains (common/ops.py): of each runtime whose
    registry row `checks_ops` that runs a user twin here (our own models run on every runtime), its
    capture launch's one traced step under the runtime's op watch."""
    return {
        n: Launch(base.spec, (*base.flags, "--check-ops"))
        for n in opts.names
        if backends.info(n).checks_ops
        and n not in opts.reused
        and isinstance(opts.spec_of(n).model, TwinSpec)
        for base in [capture_launch(opts, n)]
    }


def describing_runs(opts: CompareOptions) -> dict[str, str]:
    """{family: the backend whose main run the process that describes that side of a twin goes on to
    make} (compare/runs/prepare.py): one interpreter per side, not one to describe and one to train.
    The side's first backend to run in that side's describing interpreter, run as one process (not
    --processes / hosts, not reused). The NNX side only when its backend is the first thing to run:
    describing builds the NNX model on JAX's default device, which a waiting process would hold (a
    TPU's chips, a GPU's preallocated memory) while the op checks or other backends ran; the torch
    side builds on the CPU. Nor where that backend's mesh is its own (a one-sided `mesh.` override):
    the describing step sets JAX's CPU device count for the run's mesh, which no process can change
    once JAX is initialised."""
    launched = [n for n in opts.names if n not in opts.reused]
    if opts.hosts.total > 1 or not launched:
        return {}
    runs = {}
    for family in backends.FAMILIES:
        first = next(
            (
                n
                for n in launched
                if backends.info(n).family == family
                and opts.side(n).python == opts.describer(family)
            ),
            None,
        )
        if first:
            runs[family] = first
    own_mesh = "nnx" in runs and any(s.startswith("mesh.") for s in opts.side(runs["nnx"]).sets)
    if runs.get("nnx") != launched[0] or own_mesh or op_check_launches(opts):
        runs.pop("nnx", None)
    return runs


def model_variants(opts: CompareOptions, spec) -> dict[str, dict[str, object]]:
    """{family: {backend: its spec}} for the backends to run whose model differs from the run's (a
    kernel switch, say: `--jax-set model.kernel=pallas`): the side's describe step builds each too,
    so a value its factory refuses is refused before any run directory exists."""
    variants: dict[str, dict[str, object]] = {}
    for name in opts.names:
        if name in opts.reused or opts.spec_of(name).model == spec.model:
            continue
        variants.setdefault(backends.info(name).family, {})[name] = opts.spec_of(name)
    return variants

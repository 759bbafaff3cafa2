"""One backend process's run, written once: the options it was started with, and the loop's
bookkeeping and its run record's around each runtime's own step.

Every runtime's trainer (jax_impl.train.JaxTrainer, torch_impl.train.TorchTrainer,
torch_xla_impl.train.TorchXlaTrainer, torchax_impl.train.TorchaxTrainer) keeps its idiomatic step,
loader and sync, and implements `Runtime`: the same names and signatures on every backend, which the
benchmarks time too. `run` owns what every backend does alike: the timeline compare's wall-time
breakdown reads, the start and the provoked recompiles in the record, the step-0 parity tensors and
activations at their place, the loop with its progress lines and its stop at a non-finite loss, the
dropout sites and the peak RSS.

Numpy only: each backend's `__main__` imports its framework, builds its trainer and hands it here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from common import generation
from common.capture import decisions
from common.capture.activations import Capture
from common.data import activation_inputs
from common.data.masks import record_sites
from common.files.record import RecordError, RunRecord, peak_rss_mb
from common.provoke import Provocation
from common.spec import RunSpec, SpecError
from common.twin import twin_of
from common.weights.checkpoint_ref import CheckpointRef
from driver.process import ProcessFlags


@dataclass(frozen=True)
class RunOptions:
    """How a backend process runs, read once from its command line (driver/backend_main.py); its
    spec is apart (one spec file)."""

    parity: bool = False  # step-0 tensors, final parameters and state, eval-mode logits
    # tensor_file.BACKEND_TENSOR_MODES: the parameter-sized groups whole, or as summaries
    tensors: str = "full"
    # keys kept whole in the summary mode (compare/runs/second_pass.py)
    whole_tensors: tuple[str, ...] = ()
    activations: bool = False  # step 0's per-module inputs and outputs
    # False: step 0's activations from the start weights, and nothing trained (a capture run)
    train: bool = True
    # the start weights; None: the spec's own initialisation
    checkpoint: CheckpointRef | None = None
    # pipelined steps after the loop; None: train.steps up to 10 (common/files/record.py), 0: none
    throughput_steps: int | None = None
    provocations: tuple[Provocation, ...] = ()  # recompiles provoked on purpose (common/provoke.py)
    profile_steps: int = 0  # steps under the framework's profiler after the loop
    hlo: bool = True  # read the compiled step's HLO statistics
    compile_cache: Path | None = None
    # the run directory (profile traces, HLO dumps); None: nothing written
    out_dir: Path | None = None
    own: object = ProcessFlags()  # the backend's own flags, in the type its add_flags returns
    # a capture run whose top-k/argmax/sort choices this one's capture takes instead of its own
    # (common/capture/decisions.py)
    impose_decisions: Path | None = None
    # the (row, token) of step 0's batch the capture starts at (common/data/)
    capture_at: tuple[int, int] = (0, 0)
    # a capture run: train this many steps first, then capture on that step's batch
    capture_step: int = 0
    # the runtime's named behaviours made eager torch's (common/runtime_behaviours.py)
    match_behaviours: tuple[str, ...] = ()
    # an op check's run (common/ops.py): a jitted runtime traces its step too (`trace_step`)
    check_ops: bool = False
    # a generation run (common/generation.py): prefill and this many greedy decode steps from the
    # start weights, nothing trained; 0: none
    generate: int = 0
    # the generation run whose tokens this one is fed (the reference's); None: its own choices
    generate_tokens: Path | None = None
    # the decode step whose call a generation run captures module by module; None: none
    capture_decode_step: int | None = None


class Runtime(Protocol):
    """What a runtime's trainer implements for `run`."""

    spec: RunSpec
    data: object  # its dataset (common.data.make_dataset): global_batch(step)
    # where its weights came from and what loading them cost (common.weights.start_info)
    start: dict
    dropout_sites: list  # step 0's dropout calls, when fed common's masks (common/data/masks.py)
    # step-0 activations taken after the run (from the start weights) or before it
    captures_after_run: bool

    def new_record(self) -> RunRecord:
        """The run record, its platform, numerics and settle steps filled in."""

    def step0_tensors(self) -> dict:
        """Before any update: step 0's logits and loss and every gradient, canonical."""

    def step0_activations(self, inputs, targets) -> Capture:
        """Every module's input and output on `inputs` (a slice of step 0's batch), from the start
        weights, and the gradient of the loss on `targets` (the same slice) at each of them."""

    def batches(self, first: int, n: int) -> Iterable:
        """The batches of steps first .. first + n - 1, on the device, in order."""

    def timed_step(self, step: int, batch) -> tuple[float, float]:
        """One loop step: (its loss on the host, synced wall ms)."""

    def after_loop(self, record: RunRecord, tensors: dict) -> None:
        """The end of training: final parameters, state and eval logits, throughput, profile."""

    def analyse(self, record: RunRecord, tensors: dict) -> None:
        """What is not training and comes after it: compile events and causes, HLO statistics,
        flops."""

    def float32_islands(self, inputs, targets) -> tuple[dict[str, str], dict[str, int]]:
        """A float64 run: {module path: "float32: op, ..."} of the modules whose own operations
        compute in a narrower float on `inputs` (a slice of step 0's batch), and "(loss)" where the
        loss on `targets` does, from the start weights, in eval mode, with no effect on the run
        (torch_impl/islands.py, jax_impl/islands.py); and {cast: count} of the casts to float32
        that forward widened (train.float32_casts=widen: torch_impl/widen.py,
        jax_impl/widen.py)."""


def refuse_float64_on(platform: str, spec: RunSpec) -> None:
    """A float64 run on a TPU, which has no float64: refused in one line that says where the proof
    runs."""
    if spec.train.dtype == "float64" and platform.lower() == "tpu":
        raise SpecError(
            "train.dtype=float64: TPUs have no float64; prove the port on the host's CPU "
            "(JAX_PLATFORMS=cpu, PJRT_DEVICE=CPU) and run the TPU in float32 or bfloat16"
        )


def run(
    make_runtime: Callable[[], Runtime], options: RunOptions, progress=None
) -> tuple[RunRecord, dict]:
    """Train the runtime `make_runtime` builds; returns its record and parity tensors (the caller
    writes both)."""
    # epoch seconds: compare places them against the process launch
    timeline = {"ready": time.time()}
    runtime = make_runtime()
    spec = runtime.spec
    # a float64 run's first forward: a model whose code cannot compute in float64 is refused here,
    # naming its module
    batch = runtime.data.global_batch(0) if spec.train.dtype == "float64" else None
    islands, widened = (
        runtime.float32_islands(
            activation_inputs(spec, batch.inputs), activation_inputs(spec, batch.targets)
        )
        if batch is not None
        else ({}, {})
    )
    tensors = runtime.step0_tensors() if options.parity else {}
    record = runtime.new_record()
    record.float32_islands, record.float32_casts_widened = islands, widened
    # how the tensor file keeps the parameter-sized groups (tensor_file.SUMMARIZED_GROUPS)
    if options.parity:
        record.extra.tensors = options.tensors
    if (
        options.activations
        and not (runtime.captures_after_run and options.train)
        and not options.capture_step
    ):
        _capture(runtime, record, tensors, options.capture_at)
    record.extra.start, record.extra.provoked = (
        runtime.start,
        [str(p) for p in options.provocations],
    )
    # an op check (common/ops.py): the step itself traced too, as the run will trace it (a jitted
    # runtime: its backward's ops, and what its jit cannot trace)
    if options.check_ops and hasattr(runtime, "trace_step"):
        runtime.trace_step()
    if options.generate:  # a generation run (common/generation.py): nothing trained
        tensors[generation.GROUP] = _generation(runtime, options)
        if "capture" in tensors[generation.GROUP]:
            capture = tensors[generation.GROUP].pop("capture")
            record.extra.capture_step = options.capture_decode_step
            _keep_capture(record, tensors, capture)
        record.extra.notes["decode_path"] = getattr(runtime, "decode_how", "eager")
    # compare's capture run (compare/runs/capture_runs.py): no step, no compile of one
    if not options.train:
        # ... but those before a later step's: its capture takes the weights they left
        if options.capture_step:
            for step, batch in enumerate(runtime.batches(0, options.capture_step)):
                runtime.timed_step(step, batch)
            _capture(runtime, record, tensors, options.capture_at, options.capture_step)
        record.timeline, record.peak_rss_mb = timeline, peak_rss_mb()
        return record, tensors
    timeline["loop_start"] = time.time()
    for step, batch in enumerate(runtime.batches(0, spec.train.steps)):
        value, wall_ms = runtime.timed_step(step, batch)
        if progress:
            progress(step, value, wall_ms)
        if not record.add_step(step, value, wall_ms):
            break
    runtime.after_loop(record, tensors)
    timeline["loop_end"] = time.time()
    runtime.analyse(record, tensors)
    # last: its graphs are analysis, never the run's
    if options.activations and runtime.captures_after_run:
        _capture(runtime, record, tensors, options.capture_at)
    record_sites(record, spec, runtime.dropout_sites)
    # a twin's own batches (common/data/batches.py): what each array was
    if hasattr(runtime.data, "arrays_fed"):
        record.extra.batch_arrays = runtime.data.arrays_fed()
    # what the run trained on
    record.extra.loss = twin_of(spec.model).loss or f"the task's ({spec.task})"
    record.timeline, record.peak_rss_mb = timeline, peak_rss_mb()
    return record, tensors


def _generation(runtime: Runtime, options: RunOptions) -> dict:
    """Prefill and options.generate decode steps of the runtime's decode path, on prompts from step
    0's batch; fed the tokens of options.generate_tokens' run when given."""
    spec = runtime.spec
    if spec.task != "lm":
        raise SpecError(f"--generate: takes a language model (task lm); this spec's is {spec.task}")
    try:
        tokens, mask = generation.prompts(
            runtime.data.global_batch(0).inputs, options.generate, spec.model.seq_len
        )
    except ValueError as e:
        raise SpecError(str(e)) from None
    try:
        forced = generation.fed_tokens(options.generate_tokens) if options.generate_tokens else None
    except (ValueError, RecordError, OSError) as e:
        raise SpecError(
            f"--generate-tokens {options.generate_tokens}: {getattr(e, 'strerror', None) or e}; "
            "give the directory of a generation run (--generate) of this spec"
        ) from None
    if forced is not None and forced.shape != (options.generate, len(tokens)):
        raise SpecError(
            f"--generate-tokens {options.generate_tokens}: {list(forced.shape)} tokens, not "
            f"{options.generate} steps of {len(tokens)} prompts; give a generation run of this "
            "spec and N"
        )
    at = options.capture_decode_step
    return runtime.generate(tokens, mask, options.generate, forced, capture_at=at)


def _capture(
    runtime: Runtime, record: RunRecord, tensors: dict, at: tuple[int, int], step: int = 0
) -> None:
    """Step 0's capture, of a slice of its batch (activation_inputs); at a later `step`, the choices
    of that step's whole batch alone (a choice that parts two runs may be any token's:
    compare/runs/extra_runs.py)."""
    batch = runtime.data.global_batch(step)
    if step:
        capture = runtime.step0_activations(batch.inputs, batch.targets)
        record.extra.capture_step = step
        tensors[decisions.GROUP], record.extra.decisions = decisions.to_tensors(capture.decisions)
        return
    capture = runtime.step0_activations(
        activation_inputs(runtime.spec, batch.inputs, at),
        activation_inputs(runtime.spec, batch.targets, at),
    )
    record.extra.capture_at = list(at)
    _keep_capture(record, tensors, capture)


def _keep_capture(record: RunRecord, tensors: dict, capture: Capture) -> None:
    """A capture's arrays in the tensor file, its facts in the record."""
    tensors["activations"], record.extra.activations_skipped = capture.arrays, capture.skipped
    record.extra.activations_more_inputs = capture.more_inputs
    record.extra.activations_more_outputs = capture.more_outputs
    record.extra.activations_replicas_differ = capture.replicas_differ or None
    tensors["activation_grads"] = capture.grads
    tensors[decisions.GROUP], record.extra.decisions = decisions.to_tensors(capture.decisions)

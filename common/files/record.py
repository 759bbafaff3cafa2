"""The run record: what each backend writes and `compare` reads.

A run directory holds `record.json` (this schema) and, with `--parity`, `tensors.npz` (canonical
layout, keys `<group>/<canonical name>`, groups `outputs`, `grads`, `params`, `state` (BatchNorm's
running statistics after training, canonical names: `<NNX module>.mean`, `.var`), `eval` (`logits`:
the trained model's eval-mode forward on a held batch, dropout off and BatchNorm on its running
statistics) and `activations`: step 0's per-module outputs and inputs (`<module>:in`) in the order
the modules finished, channel-last, and `activation_grads`: the step-0 loss's gradient at each of
them, same keys and layout; a multi-process run's whole tensors in its processes' shard files:
common/files/shards.py). Both are written atomically (temp file + rename), so a reader never sees
half a file. `read_record` validates and raises `RecordError` with one line on a bad file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from common.files.fsutil import require_regular_file, write_json_atomic
from common.vocab import BF16_MODE_WORDS, Bf16Mode, Phase, RecordStatus, values

# 2: settle_steps, timeline, peak_rss_mb, trace_ms, trace_mode and compile_cache became typed
# fields (they were free-form `extra` keys in 1); compile events say whether they were cache hits.
SCHEMA_VERSION = 2
RECORD_FILE = "record.json"
LOG_FILES = ("stdout.log", "stderr.log")  # compare's logs of a backend it runs, beside the record
# compare --processes: the other processes' logs (compare/runs/processes.py), beside them
PROCESS_LOGS = "processes"
# the spec compare resolved for a backend, written beside them before it starts
SPEC_FILE = "spec.json"
# Environment variables that change numerics, devices or compilation.
NUMERICS_ENV = (
    "XLA_FLAGS",
    "LIBTPU_INIT_ARGS",
    "JAX_PLATFORMS",
    "JAX_ENABLE_X64",
    "JAX_DEFAULT_MATMUL_PRECISION",
    "PJRT_DEVICE",
    "CPU_NUM_DEVICES",
    "PJRT_CPU_ASYNC_CLIENT",
    "XLA_USE_BF16",
    "XLA_DOWNCAST_BF16",
    "XLA_USE_SPMD",
    "PT_XLA_DEBUG_LEVEL",
    "TPU_NUM_DEVICES",
)


class RecordError(ValueError):
    """A run record or tensor file that cannot be used; one line."""


@dataclass
class StepRecord:
    step: int
    loss: float | None  # None when the loss was NaN or Inf
    wall_ms: float  # synced: the host waited for the device before the clock stopped


@dataclass
class CompileEvent:
    fun_name: str
    duration_s: float  # compile time, or the time to load the executable on a persistent-cache hit
    step: int  # the train step running when it compiled; -1 in setup
    phase: str  # Phase: "setup" (before the first train step) or "loop"
    # loaded from the persistent compile cache: still a compile request, never hidden
    cache_hit: bool = False


@dataclass
class RunExtra:
    """A run record's `extra`: the facts the driver records of a run (driver/harness.py) and the
    runtime's own notes. record.json keeps the object and its keys as they always were: the notes
    (the runtime's words for its step API, mesh strategy, mode, ...) first, then each fact the run
    set (one left None is not written)."""

    # --tensors: how the tensor file keeps the parameter-sized groups (with --parity)
    tensors: str | None = None
    # the (row, token) of step 0's batch the activation capture started at
    capture_at: list[int] | None = None
    # a capture after that many steps, on that step's batch (driver/harness.py)
    capture_step: int | None = None
    # the buffers (own names) training changed: compared after it
    buffers_changed: list[str] | None = None
    # common.capture.activations.Capture's facts besides its arrays
    activations_skipped: dict | None = None
    activations_more_inputs: dict | None = None
    activations_more_outputs: dict | None = None
    # {module: {devices, max_abs}}: a captured output whose copies on the devices that should hold
    # the same values (its replicas) differ (jax_impl/capture.py)
    activations_replicas_differ: dict | None = None
    # how a run on a mesh placed its parameters: {"mesh": {axis: size}, "params": {canonical name:
    # its partition spec, an axis, a list of axes or None a dimension}}, the sharded ones alone
    shards: dict | None = None
    # step 0's top-k / argmax / sort choices (common/capture/decisions.py)
    decisions: list | None = None
    # where the weights came from and what loading them cost (common.weights.start_info)
    start: dict | None = None
    provoked: list[str] | None = None  # the recompiles provoked on purpose (common/provoke.py)
    counters: dict | None = None  # torch_xla's own metrics counters
    eval_forward: str | None = None  # how the jax runtime's eval-mode forward ran
    # step 0's dropout calls, fed common's masks (common/data/masks.py)
    dropout_sites: list[str] | None = None
    # a twin's own batches: what each array was (common/data/batches.py)
    batch_arrays: dict | None = None
    # what the run trained on: the task's loss, a twin's own ({side: function}) or "model"
    loss: object = None
    notes: dict = field(default_factory=dict)  # the runtime's own notes: {what: its words}

    def to_dict(self) -> dict:
        facts = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "notes"
        }
        return {**self.notes, **{k: v for k, v in facts.items() if v is not None}}

    @classmethod
    def from_dict(cls, raw: dict) -> RunExtra:
        if not isinstance(raw, dict):
            raise TypeError(f"extra is {type(raw).__name__}, not an object")
        facts = {f.name for f in dataclasses.fields(cls)} - {"notes"}
        return cls(
            **{k: v for k, v in raw.items() if k in facts},
            notes={k: v for k, v in raw.items() if k not in facts},
        )


@dataclass
class RunRecord:
    backend: str
    spec: dict
    status: str = RecordStatus.OK
    message: str = ""  # what went wrong, when status is not ok
    versions: dict = field(default_factory=dict)
    # system, machine, device_kind, device_count, process_count
    platform: dict = field(default_factory=dict)
    # dtype, matmul_precision, env, backend-specific settings
    numerics: dict = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)
    # pipelined: steps, seconds, steps_per_s, examples_per_s
    throughput: dict = field(default_factory=dict)
    compile_events: list[CompileEvent] = field(default_factory=list)
    recompile_causes: list[dict] = field(default_factory=list)  # {step, fun_name, cause}
    hlo_stats: dict | None = None  # op_histogram, flops, bytes_accessed, memory, hlo_file
    tensors: str | None = None  # path of the tensor file, relative to the record
    # loop steps that may compile; a compile at a later step is a steady-state recompile
    settle_steps: int = 1
    timeline: dict = field(default_factory=dict)  # epoch seconds: ready, loop_start, loop_end
    peak_rss_mb: float | None = None  # the backend process's peak resident memory
    # per step: host time building the graph (torch_xla)
    trace_ms: list[float] = field(default_factory=list)
    # TraceMode of a torch_xla run; None where the backend has no such choice
    trace_mode: str | None = None
    # dir, hits, misses, and why it is off or failing
    compile_cache: dict = field(default_factory=dict)
    # matmul + conv flops counted by a runtime without HLO (eager torch)
    flops_per_step: float | None = None
    flops_source: str = ""  # how flops_per_step was counted
    # --profile N: {steps, dir, tool, step_ms}: the trace under dir, our clock per step
    profile: dict | None = None
    extra: RunExtra = field(default_factory=RunExtra)  # the run's facts and the runtime's notes
    # a float64 run's modules computing in a narrower float on purpose:
    # {module path: "float32: op, ..."}
    float32_islands: dict = field(default_factory=dict)
    # the model's casts to float32 a float64 run widened in one forward of step 0
    # (train.float32_casts): {cast: count}
    float32_casts_widened: dict = field(default_factory=dict)
    # {dtype: number of parameter tensors} of the model as the run built and trained it (measured:
    # a bfloat16 run loaded in bfloat16 holds bfloat16 ones, TrainSpec.bf16_mode)
    param_dtypes: dict = field(default_factory=dict)
    # the compare run it belongs to (`--run-id`); compare judges only its own run's
    run_id: str | None = None
    schema_version: int = SCHEMA_VERSION

    def add_step(self, step: int, loss: float, wall_ms: float) -> bool:
        """Record a step; a NaN/Inf loss marks the run non-finite and returns False (stop
        training)."""
        self.steps.append(StepRecord(step, finite_or_none(loss), wall_ms))
        if math.isfinite(loss):
            return True
        self.status, self.message = RecordStatus.NONFINITE, f"loss is {loss} at step {step}"
        return False

    @property
    def losses(self) -> list[float | None]:
        return [s.loss for s in self.steps]

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "extra": self.extra.to_dict()}


def timed_from(record: RunRecord) -> int:
    """First step counted in step-time statistics (TrainSpec.timed_from, read from the record's
    spec)."""
    train = record.spec["train"]
    return min(int(train["timing_warmup_steps"]), int(train["steps"]) - 1)


def finite_or_none(x: float) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def write_record(run_dir: str | Path, record: RunRecord) -> Path:
    path = Path(run_dir) / RECORD_FILE
    write_json_atomic(path, record.to_dict())
    return path


def _fail(path, what: str) -> RecordError:
    return RecordError(f"run record {path} {what}")


NOT_OURS_FIX = "give the record.json (or the run directory) a backend of this toolkit wrote"
_JSON_OF = {
    "dict": dict,
    "list": list,
    "str": str,
    "int": int,
    "float": (int, float),
    "bool": bool,
    "None": type(None),
}


def _json_kind(value) -> str:
    return {
        dict: "a JSON object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
    }.get(type(value), "a number")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shape_problem(raw: dict, cls: type, prefix: str) -> str | None:
    """The first field of `raw` whose JSON type is not the one `cls` declares ('steps[3].loss is a
    string, not float | None'), or None. Fields of other types (a nested dataclass) are checked by
    their own call."""
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        allowed = [_JSON_OF.get(t.strip().split("[")[0]) for t in str(f.type).split("|")]
        if None in allowed:
            continue
        value = raw[f.name]
        ok = any(isinstance(value, t) for t in allowed) and not (
            isinstance(value, bool) and bool not in allowed
        )
        if not ok:
            return f"{prefix}{f.name} is {_json_kind(value)}, not {f.type}"
    return None


def _nonfinite_at(value, where: str) -> str | None:
    """Where a NaN or an infinity sits in a parsed record (its writer never writes one:
    allow_nan=False, a non-finite loss is null), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return (
            f"{where or 'it'} is {value}, which this toolkit never writes (a non-finite loss "
            "is null)"
        )
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        found = _nonfinite_at(
            item,
            f"{where}.{key}"
            if isinstance(key, str) and where
            else (key if isinstance(key, str) else f"{where}[{key}]"),
        )
        if found:
            return found
    return None


def read_record(path: str | Path) -> RunRecord:
    """Read and validate a record.json (or a run directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / RECORD_FILE
    require_regular_file(path, "run record", RecordError)  # a FIFO would block the read forever
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise _fail(path, "does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise _fail(path, f"cannot be read: {e}") from None
    except json.JSONDecodeError as e:
        raise _fail(path, f"is not valid JSON (truncated or corrupt): {e}") from None
    except RecursionError:
        raise _fail(
            path, f"is not a run record of this toolkit (its values nest too deep); {NOT_OURS_FIX}"
        ) from None
    if not isinstance(raw, dict) or "schema_version" not in raw:
        what = "a JSON object without schema_version" if isinstance(raw, dict) else _json_kind(raw)
        raise _fail(path, f"is not a run record of this toolkit (it holds {what}); {NOT_OURS_FIX}")
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise _fail(
            path,
            f"has schema_version {version!r}; this toolkit reads {SCHEMA_VERSION} "
            "(re-run the backend with this version)",
        )
    names = {f.name for f in dataclasses.fields(RunRecord)}
    required = {
        f.name
        for f in dataclasses.fields(RunRecord)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    missing = sorted(required - set(raw))
    if missing:
        raise _fail(
            path,
            f"is not a run record of this toolkit: it lacks the field {missing[0]!r}; "
            f"{NOT_OURS_FIX}",
        )
    unknown = sorted(set(raw) - names)
    if unknown:
        raise _fail(path, f"has an unknown field {unknown[0]!r}")
    problem = _shape_problem(raw, RunRecord, "") or _nonfinite_at(raw, "")
    if problem:
        raise _fail(path, f"is not a run record of this toolkit: {problem}; {NOT_OURS_FIX}")
    try:
        record = RunRecord(**raw)
        record.steps = [StepRecord(**s) for s in raw.get("steps", [])]
        record.compile_events = [CompileEvent(**e) for e in raw.get("compile_events", [])]
        record.extra = RunExtra.from_dict(raw.get("extra", {}))
    except TypeError as e:
        raise _fail(path, f"has a malformed entry: {e}") from None
    problem = next(
        filter(
            None,
            [
                _shape_problem(vars(s), StepRecord, f"steps[{i}].")
                for i, s in enumerate(record.steps)
            ]
            + [
                _shape_problem(vars(e), CompileEvent, f"compile_events[{i}].")
                for i, e in enumerate(record.compile_events)
            ],
        ),
        None,
    )
    if problem:
        raise _fail(path, f"has a malformed entry: {problem}")
    if record.status not in values(RecordStatus):
        raise _fail(
            path, f"has status {record.status!r}, expected one of {', '.join(values(RecordStatus))}"
        )
    if "model" not in record.spec:
        raise _fail(path, "has no spec with a model section")
    train = record.spec.get("train")
    if not isinstance(train, dict) or not all(
        _is_int(train.get(k)) for k in ("steps", "timing_warmup_steps")
    ):
        raise _fail(path, "has no spec.train with integer steps and timing_warmup_steps")
    for e in record.compile_events:
        if e.phase not in values(Phase):
            raise _fail(path, f"has a compile event with phase {e.phase!r}")
    return record


# the pipelined throughput's extra steps unless a backend is told (--throughput-steps): the run's
# own number, at most this many. One clock over the steps dispatched back to back: a run of 50
# steps paid 50 more for a figure 10 give (gpt-tiny's pipelined ms: see docs/performance.md)
PIPELINED_STEPS = 10


def pipelined_steps(spec, asked: int | None) -> int:
    """The extra steps the pipelined throughput times: `asked` (--throughput-steps; 0: none), else
    the run's steps up to PIPELINED_STEPS."""
    return min(spec.train.steps, PIPELINED_STEPS) if asked is None else asked


def throughput_summary(spec, steps: int, seconds: float) -> dict:
    """Pipelined throughput of `steps` steps of a RunSpec that took `seconds` in all."""
    examples = spec.train.global_batch_size * steps
    out = {
        "steps": steps,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "examples_per_s": examples / seconds,
    }
    if spec.is_language_model:
        out["tokens_per_s"] = examples * spec.seq_len / seconds
    return out


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports KiB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


def package_versions(*names: str) -> dict[str, str]:
    """Installed versions (python, numpy and the given distributions), without importing them."""
    from importlib import metadata  # here: ~10 ms of the import of every process that reads this

    out = {"python": platform.python_version(), "numpy": np.__version__}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def precision_numerics(train, autocast_policy: str) -> dict:
    """A record's words for how the run held the model in bfloat16 (common.vocab.Bf16Mode): the
    mode, and the runtime's own policy words for autocast (`autocast_policy`)."""
    if train.dtype != "bfloat16":
        return {"bf16_mode": None, "bf16_policy": autocast_policy}
    loaded = train.bf16_mode == Bf16Mode.LOADED
    return {
        "bf16_mode": train.bf16_mode,
        "bf16_policy": BF16_MODE_WORDS[Bf16Mode.LOADED] if loaded else autocast_policy,
    }


def dtype_counts(dtypes) -> dict[str, int]:
    """{dtype name: count} of an iterable of dtype names ("float32", not "torch.float32")."""
    out: dict[str, int] = {}
    for name in dtypes:
        name = str(name).removeprefix("torch.")
        out[name] = out.get(name, 0) + 1
    return dict(sorted(out.items()))


def numerics_env() -> dict[str, str]:
    return {k: os.environ[k] for k in NUMERICS_ENV if k in os.environ}


def host_platform() -> dict:
    return {
        "system": platform.system(),
        "machine": platform.machine(),
        "node": platform.node(),
        "python_executable": sys.executable,
    }

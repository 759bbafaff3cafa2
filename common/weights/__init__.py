"""Canonical parameters: the one bridge between the twins.

Every tensor has one dotted name and one layout, documented here once:

  dense kernel    `*.kernel`     (in, out)            y = x @ kernel + bias
  dense bias      `*.bias`       (out,)
  conv kernel     `convs.i.kernel` (kh, kw, in, out)  HWIO, NHWC activations
  embedding       `*.embedding`  (rows, d_model)
  layer norm      `*.scale`, `*.bias`  (d_model,)
  attention       `attn.{q,k,v,o}.kernel` (d_model, d_model), split (not
                  packed); head h owns columns h*hd:(h+1)*hd of q/k/v and
                  rows h*hd:(h+1)*hd of o (hd = d_model // n_heads)

Initialisation (numpy, float32, deterministic): each tensor draws from its own
generator seeded by (seed, crc32(name)), so adding or removing a tensor never
moves another one's values.

  MLP / CNN kernels   normal(0, sqrt(1 / fan_in))   (LeCun normal)
  GPT linear kernels  normal(0, 0.02); attn.o and mlp.proj use
                      0.02 / sqrt(2 * n_layers)     (GPT-2 scaled residual init)
  embeddings          normal(0, 0.02)
  biases              zeros;  layer-norm scales: ones
"""

from __future__ import annotations

import json
import math
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.files.fsutil import atomic_path, require_regular_file
from common.spec import CNNSpec, MLPSpec, ModelSpec, TransformerSpec, TwinSpec
from common.weights.checkpoint_ref import CheckpointError  # imported from here too


@dataclass(frozen=True)
class ParamInfo:
    shape: tuple[int, ...]
    init: str  # "normal", "zeros", "ones", or "checkpoint" (a user twin's, see TwinSpec)
    std: float = 0.0


def _dense(params: dict, prefix: str, n_in: int, n_out: int, std: float) -> None:
    params[f"{prefix}.kernel"] = ParamInfo((n_in, n_out), "normal", std)
    params[f"{prefix}.bias"] = ParamInfo((n_out,), "zeros")


def _layernorm(params: dict, prefix: str, d: int) -> None:
    params[f"{prefix}.scale"] = ParamInfo((d,), "ones")
    params[f"{prefix}.bias"] = ParamInfo((d,), "zeros")


def param_infos(model: ModelSpec) -> dict[str, ParamInfo]:
    """Canonical name -> shape and init, in model order."""
    params: dict[str, ParamInfo] = {}
    if isinstance(model, MLPSpec):
        n_in = model.input_size
        for i, n_out in enumerate(model.hidden_sizes):
            _dense(params, f"hidden.{i}", n_in, n_out, math.sqrt(1.0 / n_in))
            n_in = n_out
        _dense(params, "head", n_in, model.num_classes, math.sqrt(1.0 / n_in))
    elif isinstance(model, CNNSpec):
        c_in = model.input_shape[2]
        for i, (c_out, k) in enumerate(zip(model.channels, model.kernel_sizes)):
            fan_in = k * k * c_in
            params[f"convs.{i}.kernel"] = ParamInfo(
                (k, k, c_in, c_out), "normal", math.sqrt(1.0 / fan_in)
            )
            params[f"convs.{i}.bias"] = ParamInfo((c_out,), "zeros")
            c_in = c_out
        h, w = model.feature_map_hw()
        n_in = c_in if model.pooling == "global_avg" else h * w * c_in
        _dense(params, "head", n_in, model.num_classes, math.sqrt(1.0 / n_in))
    elif isinstance(model, TransformerSpec):
        d, std = model.d_model, 0.02
        residual_std = 0.02 / math.sqrt(2 * model.n_layers)
        params["wte.embedding"] = ParamInfo((model.vocab_size, d), "normal", std)
        params["wpe.embedding"] = ParamInfo((model.seq_len, d), "normal", std)
        for i in range(model.n_layers):
            b = f"blocks.{i}"
            _layernorm(params, f"{b}.ln1", d)
            for proj in ("q", "k", "v"):
                _dense(params, f"{b}.attn.{proj}", d, d, std)
            _dense(params, f"{b}.attn.o", d, d, residual_std)
            _layernorm(params, f"{b}.ln2", d)
            _dense(params, f"{b}.mlp.fc", d, model.d_ff, std)
            _dense(params, f"{b}.mlp.proj", model.d_ff, d, residual_std)
        _layernorm(params, "ln_f", d)
        if not model.tied_embeddings:
            params["lm_head.kernel"] = ParamInfo((d, model.vocab_size), "normal", std)
    elif isinstance(model, TwinSpec):  # a user twin: its NNX tree, initialised by its torch factory
        params = {
            name: ParamInfo(tuple(shape), "checkpoint") for name, shape in model.params.items()
        }
    else:
        raise TypeError(f"unknown model spec {type(model).__name__}")
    return params


def init_params(model: ModelSpec, seed: int) -> dict[str, np.ndarray]:
    """Deterministic canonical float32 parameters from `seed` (see module doc)."""
    if isinstance(model, TwinSpec):
        raise CheckpointError(
            f"twin {model.twin} starts from its torch initialisation, which compare prepares; "
            "run it through python -m compare --twin, or pass --checkpoint"
        )
    out = {}
    for name, info in param_infos(model).items():
        if info.init == "zeros":
            out[name] = np.zeros(info.shape, np.float32)
        elif info.init == "ones":
            out[name] = np.ones(info.shape, np.float32)
        else:
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            out[name] = (rng.standard_normal(info.shape) * info.std).astype(np.float32)
    return out


def param_count(model: ModelSpec) -> int:
    return sum(math.prod(i.shape) for i in param_infos(model).values())


def check_params(
    model: ModelSpec, params: dict[str, np.ndarray], source: str = "parameters"
) -> None:
    """Names and shapes must match the spec exactly; the error names the first bad tensor."""
    expected = param_infos(model)
    for name, info in expected.items():
        if name not in params:
            raise CheckpointError(
                f"{source}: tensor {name} is missing (expected shape {info.shape})"
            )
        got = tuple(params[name].shape)
        if got != info.shape:
            raise CheckpointError(
                f"{source}: tensor {name} has shape {got}, the spec needs {info.shape}"
            )
    extra = [n for n in params if n not in expected]
    if extra:
        raise CheckpointError(
            f"{source}: tensor {extra[0]} is not a parameter of this {model.family} spec"
        )


def built_otherwise(
    side: str, name: str, built, start, override: str = "such as --jax-set"
) -> CheckpointError:
    """A model whose parameters are not the start's: built with other hyperparameters than the start
    was made for (a one-sided --<backend>-set that changes the tree: `override`, which, or an
    example). The run's input, not a crash of the backend."""
    what = (
        f"has {name} of shape {tuple(built)}, the start's is {tuple(start)}"
        if built is not None and start is not None
        else f"has {name}, the start has not"
        if built is not None
        else f"lacks the start's {name}"
    )
    return CheckpointError(
        f"the {side} model built for this run {what}: its hyperparameters build another "
        f"model than the common start was made for (an override on one side, {override}, that "
        "changes the parameters?); set it on both sides with --set"
    )


def save_checkpoint(
    path: str | Path, params: dict[str, np.ndarray], metadata: dict[str, str] | None = None
) -> None:
    """Canonical checkpoint in safetensors format, written atomically (a failed write, disk full, is
    an OSError; safetensors' own writer would raise its SafetensorError)."""
    from safetensors.numpy import save

    # 0-d stays 0-d
    data = save({k: np.asarray(v, order="C") for k, v in params.items()}, metadata=metadata)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def start_params(
    model: ModelSpec, seed: int, checkpoint: str | Path | None = None
) -> dict[str, np.ndarray]:
    """What every backend starts from: the checkpoint when given, else the canonical init."""
    return load_checkpoint(checkpoint, model) if checkpoint else init_params(model, seed)


_JITTER_STREAM = 7  # the random stream of common's seeds that draws the jitter's signs


def jitter(params: dict[str, np.ndarray], ulps: int, seed: int) -> dict[str, np.ndarray]:
    """`params` with every floating-point element moved `ulps` units in the last place, up or down
    as `seed` draws (the same on every backend: names in sorted order, one generator): a
    perturbation of the size of a rounding, whose growth over a run is the float32 noise floor
    (train.start_jitter_ulps). 0: `params` itself."""
    if not ulps:
        return params
    rng = np.random.default_rng([seed, _JITTER_STREAM])
    out = {}
    for name in sorted(params):
        value = np.asarray(params[name])
        if not np.issubdtype(value.dtype, np.floating):
            out[name] = value
            continue
        toward = np.where(rng.random(value.shape) < 0.5, np.inf, -np.inf).astype(value.dtype)
        for _ in range(ulps):
            value = np.nextafter(value, toward)
        out[name] = value
    return out


def adjusted_start(params: dict[str, np.ndarray], train) -> dict[str, np.ndarray]:
    """`params` moved as the spec's train section says, the same on every backend: jittered
    (train.start_jitter_ulps), then one tensor scaled (train.start_scale: a deliberate
    difference)."""
    params = jitter(params, train.start_jitter_ulps, train.seed)
    if not train.start_scale:
        return params
    name, _, factor = train.start_scale.rpartition("*")
    if name not in params:
        raise CheckpointError(
            f"train.start_scale={train.start_scale}: {name} is not a parameter of this model "
            f"(its parameters: {', '.join(list(params)[:3])}, ...)"
        )
    value = np.asarray(params[name])
    return {**params, name: (value * float(factor)).astype(value.dtype)}


# a start's running statistics: `state/<NNX module>.mean`, `.var` (common/weights/carried.py)
STATE_PREFIX = "state/"
# a start's carried buffers: `buffer/<NNX Variable>` (common/weights/carried.py)
BUFFER_PREFIX = "buffer/"


def load_checkpoint(path: str | Path, model: ModelSpec) -> dict[str, np.ndarray]:
    """Load and check a canonical checkpoint against the spec: its tensors in the parameter dtype
    (float32; `param_arrays`, the one rule every backend's start goes through), names and shapes the
    spec's. The state it carries besides (`state/...`, `buffer/...`) is
    common/weights/carried.py's."""
    require_regular_file(path, "checkpoint", CheckpointError)  # a FIFO would block the read forever
    source = f"checkpoint {path}"
    arrays, dtypes, _ = read_safetensors(path, source)
    params = param_arrays(
        {k: v for k, v in arrays.items() if not k.startswith((STATE_PREFIX, BUFFER_PREFIX))},
        dtypes,
        source,
    )
    check_params(model, params, source=source)
    return params


def widened(arrays: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """Start weights (or batches' named arrays) in a run's state dtype: float arrays widened to
    float64 in a float64 run, exactly (the same values); integers, and every array of a float32 run,
    as they are."""
    if dtype != "float64":
        return arrays
    return {
        k: v.astype(np.float64) if v.dtype.kind == "f" and v.dtype != np.float64 else v
        for k, v in arrays.items()
    }


# every run's parameters: train.dtype=bfloat16 computes in bfloat16 over float32 ones
PARAM_DTYPE = "float32"
# converted to PARAM_DTYPE once, by param_arrays
CONVERTED_DTYPES = ("bfloat16", "float16", "float64")
SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    # others (F8_*) are named as the file says
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit on the JSON header


def check_param_dtype(name: str, dtype: str, source: str) -> None:
    """A parameter tensor is floating point: float32, or a float dtype converted to it once.
    Integers and booleans are refused: a number that was never a weight (an index, a mask, a step
    count)."""
    if dtype != PARAM_DTYPE and dtype not in CONVERTED_DTYPES:
        raise CheckpointError(
            f"{source}: tensor {name} has dtype {dtype}; parameters must be "
            f"{', '.join((PARAM_DTYPE, *CONVERTED_DTYPES))} (converted to {PARAM_DTYPE} once)"
        )


def param_arrays(
    arrays: dict[str, np.ndarray], dtypes: dict[str, str], source: str
) -> dict[str, np.ndarray]:
    """The one rule for a checkpoint's dtypes, in common so that every backend receives the same
    arrays: integer and boolean tensors are refused; float16, bfloat16 (given as its raw uint16
    bits) and float64 are converted to float32 here, exactly once; a NaN or an infinity, or a
    float64 value beyond float32's range, is refused (a model cannot start from it).
    `conversion_note` says what was converted."""
    out = {}
    for name, value in arrays.items():
        dtype = dtypes.get(name, str(value.dtype))
        check_param_dtype(name, dtype, source)
        if dtype == "bfloat16":  # its bits are the upper half of a float32's
            value = (np.asarray(value, "<u2").astype("<u4") << 16).view("<f4")
        elif not np.isfinite(value).all():
            bad = value[~np.isfinite(value)]
            raise CheckpointError(
                f"{source}: tensor {name} holds {int(np.isnan(bad).sum())} NaN and "
                f"{int(np.isinf(bad).sum())} infinite values; parameters must be finite (the "
                "checkpoint of a run that diverged?)"
            )
        with np.errstate(over="ignore"):  # a float64 beyond float32's range: refused just below
            converted = np.asarray(value, np.float32)
        if not converted.flags.aligned or not converted.flags.writeable:
            converted = converted.copy()
        if not np.isfinite(converted).all():
            what = (
                "NaN or infinite values"
                if dtype == "bfloat16"
                else f"{dtype} values beyond float32's range"
            )
            raise CheckpointError(
                f"{source}: tensor {name} holds {int((~np.isfinite(converted)).sum())} {what}; "
                "parameters must be finite in float32"
            )
        out[name] = converted
    return out


def conversion_note(dtypes: dict[str, str]) -> str | None:
    """What `param_arrays` converted, in the run record's words: 'checkpoint float16 -> float32'
    (None when every tensor was float32 already)."""
    converted = sorted({d for d in dtypes.values() if d in CONVERTED_DTYPES})
    if not converted:
        return None
    count = sum(d in CONVERTED_DTYPES for d in dtypes.values())
    return (
        f"checkpoint {', '.join(converted)} -> {PARAM_DTYPE} ({count} of {len(dtypes)} tensors, "
        "converted once "
        "in common for every backend)"
    )


def read_safetensors(path: str | Path, source: str, header_only: bool = False):
    """(arrays, dtypes, metadata) of a safetensors file, read with numpy alone: every dtype the
    format has, bfloat16 too (numpy has none: its tensors come back as their raw uint16 bits,
    `dtypes` says bfloat16). With `header_only`, arrays is empty. A file that is not one raises
    CheckpointError."""

    def unreadable(why: str) -> CheckpointError:
        return CheckpointError(f"{source} is not a readable safetensors file: {why}")

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise unreadable(f"it has {size} bytes, fewer than a header")
            n = int.from_bytes(head, "little")
            if n > min(size - 8, MAX_HEADER_BYTES):
                raise unreadable(
                    f"its header claims {n} bytes; the file has {size} (truncated, or another "
                    "format)"
                )
            try:
                header = json.loads(f.read(n))
            except (ValueError, RecursionError) as e:
                raise unreadable(f"its header is not JSON ({type(e).__name__})") from None
            entries = _check_header(header, size - 8 - n, unreadable)
            # writable: the arrays below are views
            data = None if header_only else np.fromfile(f, np.uint8)
    except FileNotFoundError:
        raise CheckpointError(f"{source} does not exist") from None
    except OSError as e:
        raise CheckpointError(f"cannot read {source}: {e.strerror or e}") from None
    dtypes = {name: SAFETENSORS_DTYPES.get(e["dtype"], e["dtype"]) for name, e in entries.items()}
    arrays = {}
    for name, e in ({} if header_only else entries).items():
        start, end = e["data_offsets"]
        stored = "uint16" if dtypes[name] == "bfloat16" else dtypes[name]
        if stored not in SAFETENSORS_DTYPES.values():
            # a dtype numpy does not have: param_arrays refuses it by name
            arrays[name] = np.zeros(0)
            continue
        arrays[name] = np.frombuffer(
            data, np.dtype(stored).newbyteorder("<"), count=math.prod(e["shape"]), offset=start
        ).reshape(e["shape"])
    metadata = header.get("__metadata__") if isinstance(header.get("__metadata__"), dict) else {}
    return arrays, dtypes, metadata


def _check_header(header, data_size: int, unreadable) -> dict:
    """The tensor entries of a safetensors header, each with a dtype, a shape and offsets inside the
    data that hold exactly its elements."""
    if not isinstance(header, dict):
        raise unreadable("its header is not a JSON object")
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    for name, e in entries.items():
        ok = (
            isinstance(e, dict)
            and isinstance(e.get("dtype"), str)
            and isinstance(e.get("shape"), list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in e["shape"])
            and isinstance(e.get("data_offsets"), list)
            and len(e["data_offsets"]) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in e["data_offsets"])
        )
        if not ok:
            raise unreadable(f"tensor {name}'s entry is not {{dtype, shape, data_offsets}}")
        start, end = e["data_offsets"]
        if not 0 <= start <= end <= data_size:
            raise unreadable(
                f"tensor {name} lies outside the file ({start}..{end} of {data_size} bytes; "
                "truncated?)"
            )
        dtype = {"bfloat16": "uint16"}.get(
            SAFETENSORS_DTYPES.get(e["dtype"]), SAFETENSORS_DTYPES.get(e["dtype"])
        )
        if dtype and end - start != math.prod(e["shape"]) * np.dtype(dtype).itemsize:
            raise unreadable(
                f"tensor {name} has {end - start} bytes for shape {e['shape']} of {e['dtype']}"
            )
    return entries

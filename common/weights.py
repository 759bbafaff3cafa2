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

import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.fsutil import atomic_path
from common.spec import CNNSpec, MLPSpec, ModelSpec, TransformerSpec, TwinSpec


class CheckpointError(ValueError):
    """A checkpoint that does not fit the spec; the message names the tensor."""


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
            params[f"convs.{i}.kernel"] = ParamInfo((k, k, c_in, c_out), "normal", math.sqrt(1.0 / fan_in))
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
        params = {name: ParamInfo(tuple(shape), "checkpoint") for name, shape in model.params.items()}
    else:
        raise TypeError(f"unknown model spec {type(model).__name__}")
    return params


def init_params(model: ModelSpec, seed: int) -> dict[str, np.ndarray]:
    """Deterministic canonical float32 parameters from `seed` (see module doc)."""
    if isinstance(model, TwinSpec):
        raise CheckpointError(f"twin {model.twin} starts from its torch initialisation, which compare prepares; "
                              "run it through python -m compare --twin, or pass --checkpoint")
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


def check_params(model: ModelSpec, params: dict[str, np.ndarray], source: str = "parameters") -> None:
    """Names and shapes must match the spec exactly; the error names the first bad tensor."""
    expected = param_infos(model)
    for name, info in expected.items():
        if name not in params:
            raise CheckpointError(f"{source}: tensor {name} is missing (expected shape {info.shape})")
        got = tuple(params[name].shape)
        if got != info.shape:
            raise CheckpointError(f"{source}: tensor {name} has shape {got}, the spec needs {info.shape}")
    extra = [n for n in params if n not in expected]
    if extra:
        raise CheckpointError(f"{source}: tensor {extra[0]} is not a parameter of this {model.family} spec")


def save_checkpoint(path: str | Path, params: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Canonical checkpoint in safetensors format, written atomically."""
    from safetensors.numpy import save_file

    tensors = {k: np.ascontiguousarray(v) for k, v in params.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def start_params(model: ModelSpec, seed: int, checkpoint: str | Path | None = None) -> dict[str, np.ndarray]:
    """What every backend starts from: the checkpoint when given, else the canonical init."""
    return load_checkpoint(checkpoint, model) if checkpoint else init_params(model, seed)


def start_info(checkpoint: str | Path | None, seconds: float) -> dict:
    """The run record's `extra.start`: where the weights came from, and what reading them and converting
    them to the runtime's layout cost."""
    return {"from": str(checkpoint) if checkpoint else "the canonical init (common/weights.py)",
            "load_and_convert_s": seconds}


def load_checkpoint(path: str | Path, model: ModelSpec) -> dict[str, np.ndarray]:
    """Load and check a canonical checkpoint against the spec."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        params = load_file(str(path))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} is not a readable safetensors file: {e}") from None
    check_params(model, params, source=f"checkpoint {path}")
    return params

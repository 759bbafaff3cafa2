"""Canonical parameters <-> torch `state_dict` (the twin of `jax_impl/convert.py`: same function names).

Plain torch: every torch runtime (PyTorch/XLA today) loads weights through it.

The tensors that change layout, and how (everything else is a rename):
  dense kernel  (in, out)          -> Linear weight (out, in)        transpose
  conv kernel   HWIO (kh,kw,i,o)   -> Conv2d weight OIHW              permute(3, 2, 0, 1)
  attn q, k, v  3 x (D, D) + bias  -> attn.qkv.weight (3D, D)         transpose each, stack rows q|k|v
Renames: `.kernel` -> `.weight`, `.embedding` -> `.weight`, LayerNorm `.scale` -> `.weight`.
Every shape is asserted before copying, naming the tensor.
"""
from __future__ import annotations

import numpy as np
import torch

from common.weights import check_params, param_infos

QKV = ("q", "k", "v")


def _torch_name(canonical: str) -> str:
    """Canonical name -> state_dict key (q/k/v map to the packed attn.qkv)."""
    parts = canonical.split(".")
    if len(parts) >= 4 and parts[-3] == "attn" and parts[-2] in QKV:
        parts[-2] = "qkv"
    if parts[-1] in ("kernel", "embedding", "scale"):
        parts[-1] = "weight"
    return ".".join(parts)


def _to_torch_layout(value: np.ndarray) -> np.ndarray:
    if value.ndim == 2:
        return value.T  # (in, out) -> (out, in); embeddings are handled by the caller
    if value.ndim == 4:
        return value.transpose(3, 2, 0, 1)  # HWIO -> OIHW
    return value


def _from_torch_layout(value: np.ndarray) -> np.ndarray:
    if value.ndim == 2:
        return value.T
    if value.ndim == 4:
        return value.transpose(2, 3, 1, 0)  # OIHW -> HWIO
    return value


def to_state_dict(canonical: dict[str, np.ndarray], model_spec) -> dict[str, torch.Tensor]:
    """Canonical arrays -> a state_dict in torch layouts (CPU tensors)."""
    check_params(model_spec, canonical)
    out: dict[str, torch.Tensor] = {}
    packed: dict[str, list] = {}
    for name in param_infos(model_spec):
        value = canonical[name]
        key = _torch_name(name)
        if not name.endswith(".embedding"):
            value = _to_torch_layout(value)
        if key.endswith((".qkv.weight", ".qkv.bias")):
            packed.setdefault(key, []).append(value)
            if len(packed[key]) < 3:
                continue
            value = np.concatenate(packed.pop(key), axis=0)  # rows q | k | v
        out[key] = torch.from_numpy(np.ascontiguousarray(value))
    return out


def to_canonical(state: dict[str, torch.Tensor], model_spec) -> dict[str, np.ndarray]:
    """A state_dict (or {parameter name: gradient}) of torch tensors on any device, or of arrays keyed
    by the same names -> {canonical name: numpy array}."""
    out = {}
    for name, info in param_infos(model_spec).items():
        key = _torch_name(name)
        if key not in state:
            raise KeyError(f"state_dict has no {key} for canonical {name}")
        value = state[key]
        if isinstance(value, torch.Tensor):
            value = value.detach().to("cpu", torch.float32).numpy()
        # a copy: on the CPU `.to("cpu")` and `.numpy()` share the live parameter's memory, which the
        # next optimizer step overwrites in place
        value = np.array(value, np.float32)
        if key.endswith((".qkv.weight", ".qkv.bias")):
            d = value.shape[0] // 3
            i = QKV.index(name.split(".")[-2])
            value = value[i * d:(i + 1) * d]
        if not name.endswith(".embedding"):
            value = _from_torch_layout(value)
        assert value.shape == info.shape, f"{name}: torch gives {value.shape}, canonical is {info.shape}"
        out[name] = np.ascontiguousarray(value)
    return out


def load_canonical(model: torch.nn.Module, canonical: dict[str, np.ndarray], model_spec) -> torch.nn.Module:
    """Copy canonical arrays into the model, asserting every shape by name."""
    state = to_state_dict(canonical, model_spec)
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    assert not missing and set(state) <= set(own), f"state_dict keys differ: missing {missing[:3]}"
    for key, value in state.items():
        assert own[key].shape == value.shape, f"{key}: model {tuple(own[key].shape)} vs canonical {tuple(value.shape)}"
    model.load_state_dict(state, strict=True)
    return model


def partition_spec(canonical: str, spec: tuple) -> tuple[str, tuple]:
    """A canonical partition spec in torch's layout: (state_dict key, spec)."""
    if len(spec) == 2 and not canonical.endswith(".embedding"):
        spec = spec[::-1]
    elif len(spec) == 4:
        spec = (spec[3], spec[2], spec[0], spec[1])
    return _torch_name(canonical), spec

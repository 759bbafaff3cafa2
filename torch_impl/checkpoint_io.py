"""Reading torch-side checkpoints in a torch process: a state_dict (`.pt`/`.pth`/`.bin` through
`torch.load(weights_only=True)`, never an arbitrary pickle; or `.safetensors`), and Hugging Face
safetensors. Tensors of any float dtype come back as float32 numpy arrays; every failure is one line
naming the file (and the tensor)."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from common.checkpoints import float32_of
from common.weights import CheckpointError

PICKLE_SUFFIXES = (".pt", ".pth", ".bin")


def _to_numpy(tensors: dict, source: str) -> dict[str, np.ndarray]:
    out = {}
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{source}: entry {name!r} is a {type(value).__name__}, not a tensor (a state_dict "
                                  "maps parameter names to tensors)")
        float32_of(name, str(value.dtype).removeprefix("torch."), source)
        out[name] = value.detach().to(torch.float32).numpy()
    return out


def load_state(path: Path) -> dict[str, np.ndarray]:
    """{name: float32 array} of a torch checkpoint file."""
    source = f"checkpoint {path}"
    if not path.is_file():
        raise CheckpointError(f"{source} does not exist")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return _to_numpy(load_file(str(path)), source)
        except (SafetensorError, OSError, ValueError) as e:
            if isinstance(e, CheckpointError):
                raise
            raise CheckpointError(f"{source} is not a readable safetensors file (truncated?): {e}") from None
    if path.suffix not in PICKLE_SUFFIXES:
        raise CheckpointError(f"{source}: a torch checkpoint is .pt, .pth, .bin or .safetensors")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{source} holds objects other than tensors, which weights_only loading refuses "
                              f"(save model.state_dict(), not the model): {str(e).splitlines()[0]}") from None
    except (EOFError, RuntimeError, OSError) as e:
        raise CheckpointError(f"{source} is not a readable torch file (truncated or corrupt): "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{source} holds a {type(obj).__name__}, not a state_dict (a dict of tensors)")
    return _to_numpy(obj, source)


def load_hf(path: Path) -> dict[str, np.ndarray]:
    """{HF name: float32 array} of an HF checkpoint's safetensors (every shard)."""
    from common.hf import weight_files

    out: dict[str, np.ndarray] = {}
    for file in weight_files(path):
        out.update(load_state(file))
    return out

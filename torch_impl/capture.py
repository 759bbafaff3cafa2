"""Step-0 activations of every torch module, named like the NNX twin's modules (the twin of
`jax_impl/capture.py`: same function name). Forward hooks record each module's first input and its
output, in the order the calls complete; modules without an NNX counterpart (a packed `attn.qkv`, say)
are left out."""
from __future__ import annotations

import numpy as np
import torch


def _first_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((v for v in value if isinstance(v, torch.Tensor)), None)
    return None


def _host(t: torch.Tensor) -> np.ndarray:
    return t.float().cpu().numpy()


def capture_activations(model: torch.nn.Module, inputs, names: dict[str, str], to_numpy=_host
                        ) -> dict[str, np.ndarray]:
    """{canonical module path: output, path + ':in': first input}; `names` maps torch module names to
    NNX module paths (torch_impl.convert.modules_to_canonical); `to_numpy` brings a runtime's tensor
    to the host (torchax's are not CPU tensors)."""
    captured: dict[str, torch.Tensor] = {}

    def hook(name):
        def record(module, args, out):
            x, y = _first_tensor(args), _first_tensor(out)
            if y is not None:
                if x is not None:
                    captured.setdefault(f"{name}:in", x.detach())
                captured.setdefault(name, y.detach())
        return record

    handles = [m.register_forward_hook(hook(names[n])) for n, m in model.named_modules() if names.get(n)]
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return {k: np.asarray(to_numpy(v), np.float32) for k, v in captured.items()}

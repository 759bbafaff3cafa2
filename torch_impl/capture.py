"""Step-0 activations of every torch module, named like the NNX twin's modules (the twin of
`jax_impl/capture.py`: same function name). Forward hooks record each module's first input and its
output, in the order the calls complete, copied when recorded (an in-place ReLU after a BatchNorm must
not rewrite the BatchNorm's output) and stored channel-last (common/activations.py). Modules called with
keyword arguments only (Hugging Face's attention) are recorded too; modules without an NNX counterpart (a
packed `attn.qkv`, say) are left out."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn.modules import batchnorm, conv, instancenorm, pooling

from common.activations import CHANNEL_FIRST, CHANNEL_LAST, Capture, LayoutTracker

# layers whose type fixes where their output's channels are (the rest: common/activations.py's rules)
CHANNEL_FIRST_TYPES = (conv._ConvNd, batchnorm._BatchNorm, instancenorm._InstanceNorm, nn.GroupNorm,
                       nn.LocalResponseNorm, pooling._MaxPoolNd, pooling._AvgPoolNd, pooling._AdaptiveAvgPoolNd,
                       pooling._AdaptiveMaxPoolNd, pooling._LPPoolNd, nn.Upsample, nn.PixelShuffle)
CHANNEL_LAST_TYPES = (nn.Linear, nn.Bilinear, nn.LayerNorm, nn.RMSNorm, nn.Embedding, nn.EmbeddingBag,
                      nn.MultiheadAttention)


def _first_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((v for v in value if isinstance(v, torch.Tensor)), None)
    if isinstance(value, dict):  # keyword arguments, or a ModelOutput (a dict)
        return next((v for v in value.values() if isinstance(v, torch.Tensor)), None)
    return None


def _own_layout(module: nn.Module) -> str | None:
    if isinstance(module, CHANNEL_FIRST_TYPES):
        return CHANNEL_FIRST
    return CHANNEL_LAST if isinstance(module, CHANNEL_LAST_TYPES) else None


def _permuted_view(x, y) -> bool:
    """`y` reads `x`'s memory in another order (a permute or transpose)."""
    try:
        return x is not None and y is not x and y.data_ptr() == x.data_ptr() and y.stride() != x.stride()
    except (RuntimeError, NotImplementedError, AttributeError):  # a tensor with no host storage (XLA, torchax)
        return False


def _host(t: torch.Tensor) -> np.ndarray:
    return t.float().cpu().numpy()


def capture_activations(model: torch.nn.Module, inputs, names: dict[str, str], to_numpy=_host,
                        sync=None) -> Capture:
    """{canonical module path: output, path + ':in': first input}, channel-last; `names` maps torch module
    names to NNX module paths (torch_impl.convert.modules_to_canonical); `to_numpy` brings a runtime's
    tensor to the host (torchax's are not CPU tensors); `sync` ends a lazy runtime's graph (torch_xla's), so
    that every copy is computed in one graph (fetched one by one, each would compile a graph of its own that
    runs the forward up to its module). The batch arrives channel-first, as fed."""
    tracker, held = LayoutTracker(CHANNEL_FIRST), {}  # key -> (copied tensor, layout)
    entered: dict[int, list] = {}

    def before(name, module, leaf):
        def record(_, args, kwargs):
            x = _first_tensor(args) if _first_tensor(args) is not None else _first_tensor(kwargs)
            entered.setdefault(id(module), []).append((x, tracker.enter(_own_layout(module), x)))
            if name and x is not None:
                held.setdefault(f"{name}:in", (x.detach().clone(), entered[id(module)][-1][1]))
        return record

    def after(name, module, leaf):
        def record(_, args, kwargs, out):
            x, in_layout = entered[id(module)].pop()
            y = _first_tensor(out)
            own = CHANNEL_LAST if module is model else _own_layout(module)  # the model's output: as returned
            layout = tracker.leave(own, leaf, in_layout, y, leaf and _permuted_view(x, y))
            if name and y is not None:
                held.setdefault(name, (y.detach().clone(), layout))
        return record

    handles = []
    for n, m in model.named_modules():
        leaf = next(m.children(), None) is None
        handles.append(m.register_forward_pre_hook(before(names.get(n), m, leaf), with_kwargs=True))
        handles.append(m.register_forward_hook(after(names.get(n), m, leaf), with_kwargs=True))
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    if sync is not None:
        held = {key: (value.float(), layout) for key, (value, layout) in held.items()}
        sync()
    capture = Capture()
    for key, (value, layout) in held.items():
        tracker.keep(capture, key, np.asarray(to_numpy(value), np.float32), layout)
    return capture

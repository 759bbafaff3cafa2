"""The torch side's decode path (common/generation.py): a Hugging Face model's own cache
(`DynamicCache`, as `generate` feeds it: position ids from the attention mask), or the twin's
`decode["torch"]`; and its training forward beside it."""

from __future__ import annotations

import copy

import numpy as np
import torch

from common.capture.activations import torch_output_layout
from common.generation import generate
from common.twin import TwinError, twin_of, twin_words, user_decode
from common.twin.outputs import forward, logits_of
from torch_impl.capture import capture_activations
from torch_impl.convert import modules_to_canonical


def host_logits(t: torch.Tensor) -> np.ndarray:
    """Logits on the host in float32 (bfloat16 widened exactly), float64 kept."""
    t = t.detach()
    return (t if t.dtype == torch.float64 else t.float()).cpu().numpy()


def hugging_face_decode(model, static: bool = False):
    """A transformers model's decode step, as its `generate` runs it: explicit position ids and
    cache positions, and a DynamicCache with the attention mask up to the tokens fed so far, or
    (`static`: fixed shapes, what a compiling runtime needs) a StaticCache of the whole sequence's
    length with the whole mask. The cache positions are data made on the host, never a Python
    number a lazy runtime would trace into the graph as a constant (one graph a token)."""
    from transformers import DynamicCache, StaticCache

    def step(tokens, positions, mask, state):
        if state is None:
            cache = (
                StaticCache(config=model.config, max_cache_len=mask.shape[1])
                if static
                else DynamicCache(config=model.config)
            )
            state = (cache, 0)
        cache, filled = state
        end = filled + tokens.shape[1]
        slots = torch.from_numpy(np.arange(filled, end)).to(tokens.device)
        out = model(
            input_ids=tokens,
            attention_mask=mask[:, : mask.shape[1] if static else end].long(),
            position_ids=positions,
            cache_position=slots,
            past_key_values=cache,
            use_cache=True,
        )
        return out.logits, (out.past_key_values, end)

    return step


def torch_decode_path(spec, model: torch.nn.Module, device, static: bool = False):
    """(decode, forward, capture) of the torch side: the twin's own decode function, or a Hugging
    Face model's (one with `prepare_inputs_for_generation`, transformers' GenerationMixin; `static`:
    its StaticCache); `capture` runs one call of it module by module (torch_impl/capture.py) on a
    copy of the cache."""
    twin = twin_of(spec.model)
    own = user_decode(twin, "torch")
    if own is not None:
        decode = lambda tokens, positions, mask, cache: own(model, tokens, positions, mask, cache)  # noqa: E731
    elif hasattr(model, "prepare_inputs_for_generation"):
        decode = hugging_face_decode(model, static)
    else:
        raise TwinError(
            f"--generate: {twin_words(spec.model)}'s torch model {type(model).__name__} is not a "
            "Hugging Face model with a cache of its own; give decode={'torch': 'file.py:decode'}"
        )
    model.eval()

    def on_device(a) -> torch.Tensor:
        tensor = torch.from_numpy(np.ascontiguousarray(a)).to(device)
        return tensor.long() if tensor.dtype in (torch.int32, torch.int64) else tensor

    def step(tokens, positions, mask, cache):
        with torch.no_grad():
            return decode(on_device(tokens), on_device(positions), on_device(mask), cache)

    def whole(tokens):
        with torch.no_grad():
            return logits_of(forward(model, on_device(tokens)), twin.logits)

    def capture(tokens, positions, mask, cache):
        rest = (on_device(positions), on_device(mask), copy.deepcopy(cache))
        return capture_activations(
            model,
            on_device(tokens),
            modules_to_canonical(model, spec.model),
            output_layout=torch_output_layout(twin.nnx_output_axes),
            call=lambda m, x: decode(x, *rest)[0],
        )

    return step, whole, capture


def generate_torch(
    spec,
    model,
    device,
    tokens,
    mask,
    n_new: int,
    forced=None,
    to_numpy=host_logits,
    static=False,
    compiles=None,
    capture_at=None,
) -> dict:
    """common.generation.generate on the torch side (`to_numpy`: the runtime's logits on the
    host; `static`: a Hugging Face model's StaticCache; `compiles()`: the runtime's compile count
    so far, where it has one; `capture_at`: the step whose call is captured module by module)."""
    step, whole, capture = torch_decode_path(spec, model, device, static)
    at = None if capture_at is None else (capture_at, capture)
    return generate(step, to_numpy, tokens, mask, n_new, forced, whole, compiles, at)

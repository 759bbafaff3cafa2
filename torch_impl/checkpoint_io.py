"""Reading torch-side checkpoints in a torch process: a state_dict (`.pt`/`.pth`/`.bin` through
`torch.load(weights_only=True)`, never an arbitrary pickle; or `.safetensors`), and Hugging Face
safetensors. Tensors of any float dtype come back as float32 numpy arrays, others (a BatchNorm's
int64 `num_batches_tracked`) as they are; parameters must be floating point. A full state_dict
loads: its buffers (BatchNorm's running statistics) come back beside the parameters. Every failure
is one line naming the file (and the tensor)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from common.files.fsutil import require_regular_file
from common.twin import hf, twin_of
from common.vocab import CheckpointFormat
from common.weights import CheckpointError
from common.weights.checkpoint_ref import CheckpointRef
from common.weights.checkpoints import check_against, float32_of

PICKLE_SUFFIXES = (".pt", ".pth", ".bin")


def _to_numpy(tensors: dict, source: str) -> dict[str, np.ndarray]:
    out = {}
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(
                f"{source}: entry {name!r} is a {type(value).__name__}, not a tensor (a state_dict "
                "maps parameter names to tensors)"
            )
        if value.is_floating_point():
            # (a float8 is refused)
            float32_of(name, str(value.dtype).removeprefix("torch."), source)
            value = value.to(torch.float32)
        out[name] = value.detach().numpy()
    return out


def load_state(path: Path) -> dict[str, np.ndarray]:
    """{name: float32 array} of a torch checkpoint file."""
    source = f"checkpoint {path}"
    require_regular_file(path, "checkpoint", CheckpointError)  # a FIFO would block the read forever
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
            raise CheckpointError(
                f"{source} is not a readable safetensors file (truncated?): {e}"
            ) from None
    if path.suffix not in PICKLE_SUFFIXES:
        raise CheckpointError(f"{source}: a torch checkpoint is .pt, .pth, .bin or .safetensors")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{source} holds objects other than tensors, which weights_only loading refuses "
            f"(save model.state_dict(), not the model): {str(e).splitlines()[0]}"
        ) from None
    except (EOFError, RuntimeError, OSError) as e:
        raise CheckpointError(
            f"{source} is not a readable torch file (truncated or corrupt): "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None
    if not isinstance(obj, dict):
        raise CheckpointError(
            f"{source} holds a {type(obj).__name__}, not a state_dict (a dict of tensors)"
        )
    return _to_numpy(obj, source)


def load_hf(path: Path) -> dict[str, np.ndarray]:
    """{HF name: float32 array} of an HF checkpoint's safetensors (every shard)."""
    out: dict[str, np.ndarray] = {}
    found_in: dict[str, str] = {}
    for file in hf.weight_files(path):
        for name, value in load_state(file).items():
            if name in found_in:  # which one from_pretrained takes is not the index's word
                raise CheckpointError(
                    f"hf checkpoint {path}: tensor {name} is in two shards ({found_in[name]} and "
                    f"{file.name}); save the checkpoint again with save_pretrained, one shard "
                    "holding each tensor"
                )
            out[name], found_in[name] = value, file.name
    return out


def load_torch_side(
    ref: CheckpointRef | str,
    spec,
    shapes: dict[str, tuple],
    buffers: dict[str, tuple] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A torch or hf checkpoint in the torch model's names, checked against its parameters
    (`shapes`): (parameters, buffers). The model's buffers (`buffers`: name -> shape) may be in it
    too, as in a full state_dict; anything else is refused with the rest of the mismatches."""
    ref = CheckpointRef.of(ref)
    fmt, path = ref.format, ref.path
    source = f"{fmt} checkpoint {path}"
    if fmt == CheckpointFormat.HF:
        twin = twin_of(spec.model)
        hf.check_config(hf.read_config(path), spec.model, twin, f"hf checkpoint {path}")
        arrays = hf.to_torch_names(load_hf(path), twin, f"hf checkpoint {path}")
    else:
        arrays = load_state(path)
    found = {n: v for n, v in arrays.items() if n in (buffers or {})}
    params = {n: v for n, v in arrays.items() if n not in found}
    check_against(params, shapes, source)
    check_against(found, {n: s for n, s in buffers.items() if n in found} if found else {}, source)
    for name, value in params.items():
        float32_of(name, str(value.dtype), source)
    return params, found


def check_carried_buffers(model, found: dict[str, np.ndarray], source: str) -> None:
    """A full state_dict's buffers (`found`, beside its parameters) held to the parameters' rules
    before anything runs: every persistent buffer of the model in it (one left out would keep the
    model's own value, not the checkpoint's), and none holding a NaN, or an infinity where the
    model's own buffer holds a finite value (a causal mask's -inf is the model's; a diverged
    run's inf is not). A checkpoint of parameters alone carries no buffer, and is not checked."""
    if not found:
        return
    own = {name: b.detach().cpu().numpy() for name, b in model.named_buffers()}
    missing = [name for name in model.state_dict() if name in own and name not in found]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise CheckpointError(
            f"{source}: it holds the model's buffers but not {missing[0]}{more}, a persistent "
            "buffer: the run would keep the model's own value of it, not the checkpoint's; save "
            "the whole state_dict, or the parameters alone to start every buffer from the model's "
            "own"
        )
    for name, value in found.items():
        value = np.asarray(value)
        if value.dtype.kind != "f" or np.isfinite(value).all():
            continue
        mine = own[name].reshape(value.shape) if own[name].size == value.size else None
        same = (
            mine is not None
            and not np.isnan(value).any()
            and np.array_equal(value[~np.isfinite(value)], mine[~np.isfinite(value)])
        )
        if not same:
            bad = value[~np.isfinite(value)]
            raise CheckpointError(
                f"{source}: buffer {name} holds {int(np.isnan(bad).sum())} NaN and "
                f"{int(np.isinf(bad).sum())} infinite values where the model's own holds finite "
                "ones; a start must be finite where the model is (the checkpoint of a run that "
                "diverged?)"
            )


def start_weights(
    model: torch.nn.Module, spec, checkpoint: CheckpointRef | None
) -> dict[str, np.ndarray]:
    """What a torch runtime starts from (canonical arrays): the canonical init or checkpoint, or a
    torch or hf checkpoint read here and carried through the model's correspondence; moved as the
    spec says (common.weights.adjusted_start)."""
    from common.weights import adjusted_start, start_params
    from torch_impl.convert import correspondence

    checkpoint = CheckpointRef.of(checkpoint)
    fmt = checkpoint.format if checkpoint else None
    if fmt in (None, CheckpointFormat.CANONICAL):
        params = start_params(spec.model, spec.train.seed, checkpoint.path if checkpoint else None)
    elif fmt == CheckpointFormat.ORBAX:
        raise CheckpointError(
            f"--checkpoint {checkpoint}: an orbax checkpoint is NNX state, which the torch "
            "runtimes "
            "cannot read; pass it to python -m compare --checkpoint or convert it with python -m "
            "compare.convert"
        )
    else:
        shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
        params = correspondence(model, spec.model).to_canonical(
            load_torch_side(checkpoint, spec, shapes)[0]
        )
    return adjusted_start(params, spec.train)

"""Canonical parameters <-> torch `state_dict` (the twin of `jax_impl/convert.py`: same function
names).

Plain torch: every torch runtime (eager, PyTorch/XLA, torchax) loads weights through it. The mapping
is not a table written here: it is derived from the model's own `named_parameters()` and the
canonical (NNX) tree by `common.twin.correspond` (renames, layouts: Linear transposed, Conv OIHW <->
HWIO, packed `attn.qkv` split into q|k|v rows), with the twin's declared `packed` and `rename`.
"""

from __future__ import annotations

import numpy as np
import torch

from common.sharding import param_partition_specs
from common.spec import MeshSpec
from common.twin import twin_of
from common.twin.correspond import Correspondence, derive
from common.twin.modules import module_map, state_names
from common.weights import CheckpointError, built_otherwise, check_params, param_infos
from common.weights.carried import StartState


def manifest(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """{parameter name: shape}, tied parameters once (as named_parameters lists them)."""
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def correspondence(model: torch.nn.Module, model_spec) -> Correspondence:
    twin = twin_of(model_spec)
    canonical = {name: info.shape for name, info in param_infos(model_spec).items()}
    return derive(
        manifest(model),
        canonical,
        packed=twin.packed,
        rename=twin.rename,
        layouts=getattr(model_spec, "layouts", {}),
    )


def modules_to_canonical(model: torch.nn.Module, model_spec) -> dict[str, str]:
    """torch module name -> canonical (NNX) module path, for the step-0 intermediates."""
    canonical = {name: info.shape for name, info in param_infos(model_spec).items()}
    # modules holding parameters, as on the NNX side: a Dropout at the index an NNX Sequential gives
    # its next Linear must not take that Linear's name
    holding = [
        name
        for name, module in model.named_modules()
        if next(module.parameters(), None) is not None
    ]
    return module_map(holding, canonical, twin_of(model_spec).rename)


def host_float(value) -> np.ndarray:
    """A float tensor (or array) as a numpy copy on the host: float64 where it is float64 (a float64
    run), else float32 (bfloat16 widened exactly). A copy: on the CPU `.to("cpu")` and `.numpy()`
    share the live parameter's memory, which the next optimizer step overwrites in place."""
    wide = value.dtype in (torch.float64, np.float64)
    if isinstance(value, torch.Tensor):
        value = value.detach().to("cpu", torch.float64 if wide else torch.float32).numpy()
    return np.array(value, np.float64 if wide else np.float32)


def canonical_state(buffers: dict, module_names: dict[str, str]) -> dict[str, np.ndarray]:
    """BatchNorm's running statistics ({buffer name: tensor or array}, on any device) by canonical
    state name (common.twin.correspond.state_names); torch-only buffers are left out."""
    names = state_names(list(buffers), module_names)
    return {canonical: host_float(buffers[name]) for name, canonical in names.items()}


def held_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every buffer the model holds but its norms' running statistics (canonical_state's, carried
    apart), by state_dict name: input statistics, EMA weights, counters, rotary tables, masks
    (common/twin/start_state.py)."""
    from torch.nn.modules.batchnorm import _NormBase

    return {
        name: buffer
        for name, buffer in model.named_buffers()
        if not isinstance(model.get_submodule(name.rpartition(".")[0]), _NormBase)
    }


def canonical_buffers(buffers: dict) -> dict[str, np.ndarray]:
    """held_buffers' values ({name: tensor or array, on any device}) as the tensor file keeps them
    after training, by their torch names (compare links them to the NNX side's:
    common/twin/start_state.py by_nnx_names): floats as host_float makes them, integers and booleans
    as they are (a copy), the rest left out."""
    out = {}
    for name, value in buffers.items():
        if isinstance(value, torch.Tensor):
            value = value.detach()
            if value.is_floating_point():
                out[name] = host_float(value)
            elif not value.is_complex():
                out[name] = value.to("cpu").numpy().copy()
        # a float, or a 16-bit one (bfloat16 is numpy kind V)
        elif np.asarray(value).dtype.kind in "fV":
            out[name] = host_float(value)
        elif np.asarray(value).dtype.kind in "iub":
            out[name] = np.array(value)
    return out


def changed_buffers(start: dict[str, np.ndarray], end: dict[str, np.ndarray]) -> list[str]:
    """The buffers (canonical_buffers' arrays at the start and after training) whose values training
    changed: what compare judges after training (the others it judged at the start, as built)."""
    return sorted(
        name
        for name, value in end.items()
        if name not in start
        or start[name].shape != value.shape
        or not np.array_equal(start[name], value)
    )


def load_state(model: torch.nn.Module, state: StartState, module_names: dict[str, str]) -> None:
    """Copy what a start carries besides parameters (common/weights/carried.py) into the model's
    buffers: canonical running statistics into its BatchNorms', carried buffers by their torch names
    (in the buffer's own dtype; a shape of the same size, a () for a (1,), taken as the
    buffer's)."""
    buffers = dict(model.named_buffers())
    torch_name = {
        canonical: name for name, canonical in state_names(list(buffers), module_names).items()
    }
    unknown = [name for name in state.statistics if name not in torch_name]
    if unknown:
        raise CheckpointError(
            f"the start's running statistics {', '.join(unknown[:3])} match no BatchNorm of the "
            "torch model; start from a checkpoint of this model"
        )
    targets = {torch_name[name]: value for name, value in state.statistics.items()}
    for name, value in state.buffers.items():
        target = buffers.get(state.torch_names[name])
        if target is None or target.numel() != np.size(value):
            raise CheckpointError(
                f"the start's buffer {name} (torch {state.torch_names[name]}, shape "
                f"{list(np.shape(value))}) matches no buffer of that size in the torch model; "
                "start "
                "from a checkpoint of this model"
            )
        targets[state.torch_names[name]] = np.reshape(value, tuple(target.shape))
    with torch.no_grad():
        for name, value in targets.items():
            buffers[name].copy_(torch.from_numpy(np.array(value)))


def to_canonical(tensors: dict, corr: Correspondence) -> dict[str, np.ndarray]:
    """A state_dict (or {parameter name: gradient}) of torch tensors on any device, or of arrays
    keyed by the same names -> {canonical name: numpy array}."""
    missing = [link.torch for link in corr.links if link.torch not in tensors]
    if missing:
        raise KeyError(f"no {missing[0]} among the torch tensors")
    return corr.to_canonical({link.torch: host_float(tensors[link.torch]) for link in corr.links})


def moved(model: torch.nn.Module, device) -> torch.nn.Module:
    """`model.to(device)` with the parameters it shares still shared. Moving to an XLA device makes
    every module's parameter anew (torch's overwrite-on-conversion, which torch_xla sets), which
    unties weights a model ties (a Hugging Face BERT's decoder and word embeddings: measured untied
    after `.to(xla)`); they are tied again here, as Hugging Face's `tie_weights()` after the move
    would."""
    owners: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                owners.setdefault(id(param), []).append((module, name))
    model = model.to(device)
    for (module, name), *others in (group for group in owners.values() if len(group) > 1):
        for other, other_name in others:
            setattr(other, other_name, getattr(module, name))
    return model


def load_canonical(
    model: torch.nn.Module, canonical: dict[str, np.ndarray], model_spec
) -> torch.nn.Module:
    """Copy canonical arrays into the model's parameters (its buffers stay as its factory made
    them).

    Each canonical tensor is copied once, straight into its place: a transposed view goes to
    `Tensor.copy_`, which does the strided copy itself, and a packed tensor's parts go to their rows
    (no contiguous intermediate, no concatenation: 124M parameters load in a fraction of the
    time)."""
    check_params(model_spec, canonical)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, parts, axis in correspondence(model, model_spec).torch_parts(canonical):
            start = (
                tuple(
                    sum(p.shape[a] for p in parts) if a == axis else n
                    for a, n in enumerate(parts[0].shape)
                )
                if parts[0].ndim
                else ()
            )
            if tuple(params[name].shape) != start:
                raise built_otherwise("torch", name, params[name].shape, start)
            if params[name].dim() == 0:  # a scalar (a temperature, a gate): one part, no rows
                params[name].copy_(torch.from_numpy(np.asarray(parts[0]).reshape(())))
                continue
            row = 0  # along the axis the parts stack on (a Conv1D packs its columns)
            for part in parts:
                params[name].narrow(axis, row, part.shape[axis]).copy_(torch.from_numpy(part))
                row += part.shape[axis]
    return model


def load_start(
    model: torch.nn.Module, start_params: dict[str, np.ndarray], state: StartState, model_spec
) -> torch.nn.Module:
    """`model` at a run's start: its parameters (load_canonical) and what the start carries besides
    (load_state)."""
    load_canonical(model, start_params, model_spec)
    load_state(model, state, modules_to_canonical(model, model_spec))
    return model


def partition_specs(model: torch.nn.Module, model_spec, mesh_spec: MeshSpec) -> dict[str, tuple]:
    """{parameter name: partition spec in torch's layout} (common/sharding.py's table, through the
    links)."""
    return correspondence(model, model_spec).torch_partition_specs(
        param_partition_specs(model_spec, mesh_spec)
    )

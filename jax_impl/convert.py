"""Canonical parameters <-> Flax NNX state (the twin of `torch_impl/convert.py`: same function
names).

NNX already stores the canonical layouts (dense kernel (in, out), conv HWIO,
split q/k/v), and its attribute paths are the canonical names, so conversion
is a rename of paths (`('blocks', 0, 'attn', 'q', 'kernel')` <->
`blocks.0.attn.q.kernel`) plus a check of every name and shape.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from common.weights import CheckpointError, built_otherwise, check_params, param_infos
from common.weights.carried import StartState


def _name(path) -> str:
    return ".".join(str(getattr(k, "key", k)) for k in path)


def to_canonical(params: nnx.State) -> dict[str, jax.Array]:
    """NNX Param state (or gradients of it) -> {canonical name: array}, left on device (and
    sharded)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(params))
    return {_name(path): leaf for path, leaf in flat}


def held_buffers(state: nnx.State) -> dict[str, jax.Array]:
    """The Variables a model's state holds besides Params, running statistics (canonical_state's,
    carried apart) and RNG state, by canonical name (the twin of torch_impl/convert.py held_buffers:
    input statistics, EMA weights, counters, rotary tables, masks), numbers only: 16-bit floats
    widened to float32 (exactly), left on the device."""
    held = to_canonical(
        nnx.filter_state(state, nnx.Not(nnx.Any(nnx.Param, nnx.BatchStat, nnx.RngState)))
    )
    wide = {jax.numpy.dtype("bfloat16"), jax.numpy.dtype("float16")}
    return {
        name: value.astype(jax.numpy.float32) if value.dtype in wide else value
        for name, value in held.items()
        if jax.numpy.issubdtype(value.dtype, jax.numpy.number) or value.dtype == bool
    }


def changed_buffers(start: dict[str, jax.Array], end: dict[str, jax.Array]) -> list[str]:
    """The buffers (held_buffers' arrays at the start and after training, compared on their devices)
    whose values training changed: what compare judges after training (the twin of
    torch_impl/convert.py's)."""
    return sorted(
        name
        for name, value in end.items()
        if name not in start
        or start[name].shape != value.shape
        or not bool(jax.numpy.array_equal(start[name], value))
    )


def load_state(rest: nnx.State, state: StartState) -> nnx.State:
    """`rest` (the model's non-parameter state) with what a start carries besides parameters
    (common/weights/carried.py): canonical running statistics in place of its BatchStat values,
    carried buffers in place of the Variables of their names (each in the Variable's own dtype,
    which widens them in a float64 run; a shape of the same size, a () for a (1,), taken as the
    Variable's)."""
    if not state.statistics and not state.buffers:
        return rest
    pure = nnx.to_pure_dict(rest)
    for name, value in [*state.statistics.items(), *state.buffers.items()]:
        node, *path = pure, *name.split(".")
        for part in path[:-1]:
            node = (
                node.get(int(part) if part.isdigit() and int(part) in node else part)
                if isinstance(node, dict)
                else None
            )
        held = node.get(path[-1]) if isinstance(node, dict) else None
        if held is None or np.size(held) != np.size(value):
            what = (
                "running statistic {} matches no BatchStat"
                if name in state.statistics
                else "buffer {} matches no Variable of its size"
            )
            raise CheckpointError(
                f"the start's {what.format(name)} of the NNX model; start from a checkpoint of "
                "this model"
            )
        node[path[-1]] = jax.numpy.asarray(np.reshape(value, np.shape(held)), held.dtype)
    nnx.replace_by_pure_dict(rest, pure)
    return rest


def load_canonical(
    params: nnx.State,
    canonical: dict[str, np.ndarray],
    model_spec,
    shardings: dict[str, jax.sharding.Sharding] | None = None,
) -> nnx.State:
    """Fill an (abstract) NNX Param state from canonical arrays, placed with `shardings`."""
    check_params(model_spec, canonical)
    pure = nnx.to_pure_dict(params)
    flat, treedef = jax.tree_util.tree_flatten_with_path(pure)
    expected = param_infos(model_spec)
    built = {_name(p): tuple(leaf.shape) for p, leaf in flat}
    for name in sorted(set(built) | set(canonical)):
        start = canonical[name].shape if name in canonical else None
        if built.get(name) != start:
            raise built_otherwise("NNX", name, built.get(name), start)
    leaves = []
    for path, _ in flat:
        name = _name(path)
        value = canonical[name]
        assert expected[name].shape == value.shape, name
        leaves.append(
            jax.device_put(np.asarray(value), shardings[name])
            if shardings
            else jax.numpy.asarray(value)
        )
    nnx.replace_by_pure_dict(params, jax.tree_util.tree_unflatten(treedef, leaves))
    return params

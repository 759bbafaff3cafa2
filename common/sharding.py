"""Framework-neutral sharding rules, read by every backend that shards (jax, torch_xla, torchax).

A partition spec is a tuple with one entry per tensor dimension: None
(replicated), one mesh axis name, or a tuple of axis names (the dimension is
split over their product). JAX turns it into a `PartitionSpec`, torch_xla
into a `mark_sharding` spec; both run it through GSPMD.

Strategies follow from the mesh (`common.spec.MeshSpec`):
  data   > 1  dp:   the batch is split over `data`; parameters replicated.
  fsdp   > 1  fsdp: the batch is also split over `fsdp`, and every parameter
                    is split over `fsdp` along its largest free dimension that
                    the axis divides (ZeRO-3 style; XLA gathers it per use).
  tensor > 1  tp:   Megatron layout: column-parallel then row-parallel.
                    GPT: q/k/v and mlp.fc split their output columns (heads
                    and d_ff), attn.o and mlp.proj split their input rows, so
                    each block needs one all-reduce after attention and one
                    after the MLP. MLP/CNN: layers alternate column / row.
User twins (`common/twin/`): dp and fsdp need nothing; tp follows the twin's `partition_rules`
(regex over canonical names -> spec), and a parameter no rule matches is replicated over `tensor`.
Axes of size 1 never appear. A dimension the axis does not divide stays
replicated (correct, only slower).
"""

from __future__ import annotations

import re

from common.spec import CNNSpec, MeshSpec, MLPSpec, ModelSpec, SpecError, TransformerSpec, TwinSpec
from common.twin import load_twin
from common.weights import param_infos

PartitionSpec = tuple  # of None | str | tuple[str, ...]

COLUMN, ROW = "column", "row"


def _tensor_parallel_role(model: ModelSpec, name: str) -> str | None:
    """'column', 'row' or None (replicated over `tensor`) for a canonical name."""
    parts = name.split(".")
    if isinstance(model, TransformerSpec):
        if parts[0] == "blocks":
            layer = ".".join(parts[2:4])
            return {
                "attn.q": COLUMN,
                "attn.k": COLUMN,
                "attn.v": COLUMN,
                "mlp.fc": COLUMN,
                "attn.o": ROW,
                "mlp.proj": ROW,
            }.get(layer)
        return COLUMN if parts[0] == "lm_head" else None  # vocab-parallel head
    if isinstance(model, MLPSpec):
        n_layers = len(model.hidden_sizes)
        index = int(parts[1]) if parts[0] == "hidden" else n_layers
    elif isinstance(model, CNNSpec):
        n_layers = len(model.channels)
        index = int(parts[1]) if parts[0] == "convs" else n_layers
        if parts[0] == "head" and model.pooling != "global_avg":
            return None  # flattened (h, w, c) rows do not line up with channel shards
    else:
        raise TypeError(type(model).__name__)
    if index == n_layers:  # the head: row-parallel when it follows a column layer
        return ROW if n_layers % 2 == 1 else None
    return COLUMN if index % 2 == 0 else ROW


def _tensor_dim(shape: tuple[int, ...], role: str, is_bias: bool) -> int | None:
    """Which dimension a column/row role splits: the output (last) or input dim."""
    if is_bias:
        return 0 if role == COLUMN else None  # row-parallel bias is added after the all-reduce
    return len(shape) - 1 if role == COLUMN else len(shape) - 2


def _rule_spec(rules, name: str, shape: tuple, mesh: MeshSpec) -> list:
    """A user twin's partition rules: the first regex that matches the canonical name gives its spec
    (axes of size 1 and splits the axis does not divide are dropped)."""
    for pattern, rule in rules:
        if re.search(pattern, name):
            rule = tuple(rule)
            if len(rule) != len(shape):
                raise SpecError(
                    f"partition rule {pattern!r} gives {len(rule)} entries for {name} of shape "
                    f"{list(shape)}; give one per dimension"
                )
            return [
                a if a and getattr(mesh, a) > 1 and shape[d] % getattr(mesh, a) == 0 else None
                for d, a in enumerate(rule)
            ]
    return [None] * len(shape)


def param_partition_specs(model: ModelSpec, mesh: MeshSpec) -> dict[str, PartitionSpec]:
    """Canonical name -> partition spec for this mesh."""
    table = {}
    rules = (
        load_twin(model.twin).partition_rules
        if isinstance(model, TwinSpec) and mesh.tensor > 1
        else ()
    )
    for name, info in param_infos(model).items():
        spec: list = [None] * len(info.shape)
        if isinstance(model, TwinSpec):
            spec = _rule_spec(rules, name, info.shape, mesh)
        role = (
            _tensor_parallel_role(model, name)
            if mesh.tensor > 1 and not isinstance(model, TwinSpec)
            else None
        )
        if role is not None:
            dim = _tensor_dim(info.shape, role, name.endswith(".bias") or name.endswith(".scale"))
            if dim is not None and info.shape[dim] % mesh.tensor == 0:
                spec[dim] = "tensor"
        if mesh.fsdp > 1:
            free = [
                d
                for d in range(len(info.shape))
                if spec[d] is None and info.shape[d] % mesh.fsdp == 0
            ]
            if free:
                spec[max(free, key=lambda d: (info.shape[d], -d))] = "fsdp"
        table[name] = tuple(spec)
    return table


def batch_axes(mesh: MeshSpec) -> None | str | tuple[str, ...]:
    """The mesh axes the batch dimension is split over."""
    axes = tuple(a for a in ("data", "fsdp") if getattr(mesh, a) > 1)
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


def batch_partition_spec(mesh: MeshSpec, ndim: int) -> PartitionSpec:
    """Inputs and targets: batch dimension split, the rest replicated."""
    return (batch_axes(mesh),) + (None,) * (ndim - 1)

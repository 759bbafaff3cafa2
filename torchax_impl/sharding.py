"""Parameter shardings of the torch model on a JAX mesh: common/sharding.py's table in torch's layout.

The mesh, batch placement and host transfers are the JAX twin's (`jax_impl.sharding`, plain JAX); only
the parameter names and layouts differ: torch keys (`blocks.0.attn.qkv.weight`) and torch layouts
(Linear (out, in), OIHW), through `torch_impl.convert.partition_spec`.
"""
from __future__ import annotations

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from common.sharding import param_partition_specs
from common.spec import MeshSpec, ModelSpec
from torch_impl.convert import partition_spec


def param_shardings(model: ModelSpec, mesh_spec: MeshSpec, mesh: Mesh) -> dict[str, NamedSharding]:
    """{state_dict key: NamedSharding}; q, k, v share the packed attn.qkv, and q's spec decides."""
    out: dict[str, NamedSharding] = {}
    for canonical, spec in param_partition_specs(model, mesh_spec).items():
        key, torch_spec = partition_spec(canonical, spec)
        out.setdefault(key, NamedSharding(mesh, PartitionSpec(*torch_spec)))
    return out

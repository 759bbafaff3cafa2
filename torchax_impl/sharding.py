"""Parameter shardings of the torch model on a JAX mesh: common/sharding.py's table in torch's
layout.

The mesh, batch placement and host transfers are the JAX twin's (`jax_impl.sharding`, plain JAX);
only the parameter names and layouts differ: torch keys (`blocks.0.attn.qkv.weight`) and torch
layouts (Linear (out, in), OIHW), through `torch_impl.convert.partition_specs`.
"""

from __future__ import annotations

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from common.spec import MeshSpec, ModelSpec
from torch_impl.convert import partition_specs


def param_shardings(
    model, model_spec: ModelSpec, mesh_spec: MeshSpec, mesh: Mesh
) -> dict[str, NamedSharding]:
    """{parameter name: NamedSharding}; q, k, v share the packed attn.qkv, and q's spec decides."""
    return {
        key: NamedSharding(mesh, PartitionSpec(*spec))
        for key, spec in partition_specs(model, model_spec, mesh_spec).items()
    }

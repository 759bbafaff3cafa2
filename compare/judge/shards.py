"""Per device, for a run on a mesh (a port with `jax.shard_map` regions, or sharded by its partition
rules): which devices' shards of a failing tensor differ, and outputs whose replicas differ.

A tensor-parallel port keeps each parameter in shards, one block a device (its run records how:
RunExtra.shards). The torch side's per-rank code holds the same blocks, rank by rank, so each
device's shard of a step-0 gradient or a trained parameter set against the same block of the other
side is that device against the rank that holds it: the devices whose shard leaves the tensor's
bound are listed, and the first of them (in the mesh's device order) is the run's first divergent
device.

On the NNX side alone, a region's output declared replicated (its out_specs leave an axis out) must
hold the same values on every device of that axis: a psum left out, or taken over the wrong axis,
leaves each device its own partial sum while shard_map's replication check is off. The capture
compares every captured output's replicas (jax_impl/capture.py) and the run names each module
whose replicas differ, with the devices that differ from the first.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from common.files.record import RunRecord
from common.files.tensor_summary import TensorSummary

SHARDED_GROUPS = ("grads/", "params/")


def device_coordinates(mesh: dict) -> list[dict]:
    """Each device's coordinates on the mesh, in its device order (row-major over the axes)."""
    axes = list(mesh)
    return [dict(zip(axes, at)) for at in itertools.product(*(range(mesh[a]) for a in axes))]


def shard_of(shape: tuple, spec: list, mesh: dict, at: dict) -> tuple[slice, ...]:
    """The block of a tensor of `shape` that the device at `at` holds under `spec`."""
    out = []
    for size, axes in zip(shape, list(spec) + [None] * (len(shape) - len(spec))):
        names = [] if axes is None else [axes] if isinstance(axes, str) else list(axes)
        index, count = 0, math.prod(mesh[a] for a in names)
        for a in names:
            index = index * mesh[a] + at[a]
        block = size // count
        out.append(slice(index * block, (index + 1) * block))
    return tuple(out)


def devices_outside(ref, other, spec: list, mesh: dict, bound: float) -> list[int]:
    """The devices whose shard of the two tensors differs by more than `bound`."""
    ref, other = np.asarray(ref, np.float64), np.asarray(other, np.float64)
    out = []
    for device, at in enumerate(device_coordinates(mesh)):
        where = shard_of(ref.shape, spec, mesh, at)
        if not np.max(np.abs(ref[where] - other[where]), initial=0.0) <= bound:
            out.append(device)
    return out


def device_check(
    ref: RunRecord,
    other: RunRecord,
    ref_tensors: dict,
    other_tensors: dict,
    tensors: dict,
    forward: dict,
) -> dict | None:
    """{tensors {key: devices outside}, first_divergent_device, replicas_differ {backend: {module:
    {devices, max_abs}}}} of a pair where a side ran on a mesh; None where neither did or nothing
    is to be said. Replicas apart by no more than the `forward` tolerance's atol are rounding (a
    collective's summation order), not a missing collective."""
    shards = ref.extra.shards or other.extra.shards
    replicas = {
        record.backend: apart
        for record, held in ((ref, ref_tensors), (other, other_tensors))
        if (
            apart := {
                module: found
                for module, found in (held.get("activations_replicas_differ") or {}).items()
                if found["max_abs"] > forward["atol"]
            }
        )
    }
    outside = {}
    for key, row in tensors.items() if shards else ():
        group, _, name = key.partition("/")
        spec = shards["params"].get(name)
        a, b = ref_tensors.get(group, {}).get(name), other_tensors.get(group, {}).get(name)
        if (
            row["within"]
            or spec is None
            or not key.startswith(SHARDED_GROUPS)
            or not row.get("tolerance_used")
            or any(isinstance(x, TensorSummary) or x is None for x in (a, b))
        ):
            continue
        bound = row["abs"] / row["tolerance_used"]
        outside[key] = devices_outside(a, b, spec, shards["mesh"], bound)
    if not outside and not replicas:
        return None
    devices = [d for key, found in outside.items() if key.startswith("grads/") for d in found]
    devices = devices or [d for found in outside.values() for d in found]
    return {
        "mesh": shards["mesh"] if shards else None,
        "tensors": outside,
        "first_divergent_device": min(devices) if devices else None,
        "replicas_differ": replicas,
    }


def replica_words(devices: dict) -> str:
    """The clause saying which modules' replicas differ, per backend."""
    said = []
    for backend, modules in (devices.get("replicas_differ") or {}).items():
        # the first module in the order they finished: the ones after it carry its values
        module, found = next(iter(modules.items()))
        listed = ", ".join(map(str, found["devices"]))
        after = f", and {len(modules) - 1} module(s) after it" if len(modules) > 1 else ""
        said.append(
            f"{backend}'s {module} holds other values on devices {listed} than on the first of "
            f"its replicas (by {found['max_abs']:.2g}: an output declared replicated that is not, "
            f"a psum left out or over the wrong axis){after}"
        )
    return "; ".join(said)

"""SPMD meshes and shardings from `common/sharding.py`'s table (the JAX twin reads the same one).

`torch_xla.runtime.use_spmd()` makes one process drive every device through
GSPMD, like `jax.jit` does: parameters get `mark_sharding` specs (converted to
torch layouts by `convert.partition_specs`), batches are sharded by
`MpDeviceLoader(input_sharding=...)`. With the packed `attn.qkv` weight a
tensor-parallel split of its 3*D rows is not head-aligned; GSPMD still
computes the same result, with more communication than Megatron's layout.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from common.sharding import batch_partition_spec
from common.spec import AXES, MeshSpec, ModelSpec, SpecError


def on_tpu_vm() -> bool:
    return any(Path(p).exists() for p in ("/dev/accel0", "/dev/vfio/0"))


def platforms_here() -> list[str]:
    """The PJRT platforms this machine has hardware for, from their device files (TPU: /dev/accel*
    or /dev/vfio/N; CUDA: /dev/nvidiaN; NEURON: /dev/neuronN)."""
    dev = Path("/dev")
    tpu = on_tpu_vm() or any(dev.glob("accel[0-9]*")) or any(dev.glob("vfio/[0-9]*"))
    cuda, neuron = any(dev.glob("nvidia[0-9]*")), any(dev.glob("neuron[0-9]*"))
    return ["CPU"] + ["TPU"] * tpu + ["CUDA"] * cuda + ["NEURON"] * neuron


def check_platform() -> None:
    """A PJRT_DEVICE naming hardware this machine lacks is a usage error naming the variable and the
    fix, not a crash when torch_xla starts ("libtpu not found"). Static (no runtime started:
    xmp.spawn needs the parent's runtime untouched); a platform torch_xla learns from a plugin is
    left to torch_xla."""
    value = os.environ.get("PJRT_DEVICE", "")
    kind = {"GPU": "CUDA"}.get(value.split("_")[0].upper(), value.split("_")[0].upper())
    have = platforms_here()
    if kind in ("CPU", "TPU", "CUDA", "NEURON") and kind not in have:
        raise SpecError(
            f"PJRT_DEVICE={value} selects a platform this machine does not have (torch_xla can "
            "use: "
            f"{', '.join(have)}); unset it (torch_xla then runs on a TPU VM's TPU, else the CPU), "
            "or run "
            "where that hardware is"
        )


def configure_platform(device_count: int) -> None:
    """PJRT device and CPU device count; must run before torch_xla is imported. A PJRT_DEVICE this
    machine lacks is refused (SpecError)."""
    if "PJRT_DEVICE" not in os.environ:
        os.environ["PJRT_DEVICE"] = "TPU" if on_tpu_vm() else "CPU"
    check_platform()
    # a count the user fixed is kept (a mismatch is then reported)
    if os.environ["PJRT_DEVICE"] == "CPU":
        os.environ.setdefault("CPU_NUM_DEVICES", str(device_count))
        os.environ.setdefault("PJRT_CPU_ASYNC_CLIENT", "true")


def make_mesh(mesh: MeshSpec):
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    available = xr.global_runtime_device_count()
    if available != mesh.device_count:
        raise SpecError(
            f"mesh data={mesh.data},fsdp={mesh.fsdp},tensor={mesh.tensor} needs "
            f"{mesh.device_count} "
            f"devices; this platform has {available} ({os.environ.get('PJRT_DEVICE')}); change "
            "--mesh"
        )
    return xs.Mesh(np.arange(mesh.device_count), (mesh.data, mesh.fsdp, mesh.tensor), AXES)


def shard_model(model, model_spec: ModelSpec, mesh_spec: MeshSpec, mesh) -> dict[str, tuple]:
    """mark_sharding on every parameter (already on the XLA device); returns key -> spec."""
    import torch_xla.distributed.spmd as xs

    from torch_impl.convert import partition_specs

    params = dict(model.named_parameters())
    # q, k, v share the packed attn.qkv: q decides
    specs = partition_specs(model, model_spec, mesh_spec)
    for key, torch_spec in specs.items():
        xs.mark_sharding(params[key], mesh, torch_spec)
    return specs


def input_sharding(mesh_spec: MeshSpec, mesh, ndims: dict[str, int]) -> dict:
    """For MpDeviceLoader: each batch entry split along its batch dimension over data (and fsdp)."""
    import torch_xla.distributed.spmd as xs

    return {
        key: xs.ShardingSpec(mesh, batch_partition_spec(mesh_spec, n)) for key, n in ndims.items()
    }


def require_spawn_mesh(mesh_spec: MeshSpec) -> None:
    """xmp.spawn is data parallel only; on CPU its replicas are threads, at most one per core."""
    if mesh_spec.fsdp > 1 or mesh_spec.tensor > 1:
        raise SpecError(
            "--mode spawn is data parallel only (one replica per device); mesh "
            f"fsdp={mesh_spec.fsdp}, "
            f"tensor={mesh_spec.tensor} needs --mode spmd"
        )
    cores = os.cpu_count() or 1
    if os.environ.get("PJRT_DEVICE") == "CPU" and mesh_spec.data > cores:
        raise SpecError(
            f"--mode spawn on CPU runs one thread per replica: mesh data={mesh_spec.data} exceeds "
            "the "
            f"{cores} cores here, where replicas were seen to diverge (docs/xmp-spawn-cpu.md); "
            f"use data<={cores} or --mode spmd"
        )

"""Mesh and NamedShardings from `common/sharding.py`'s table; multi-process setup.

The mesh uses Auto axis types explicitly: in JAX 0.10 `jax.make_mesh`
defaults to Explicit axes, where the Megatron layout fails with "Contracting
dimensions are sharded and it is ambiguous". With Auto axes GSPMD propagates
shardings and inserts the collectives.
"""

from __future__ import annotations

import contextlib
import os
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from common.data import Batch
from common.environment import coordinator_wait_s
from common.files.shards import ShardedTensor
from common.multiprocess import other_settings, refuse_taken_port, settings_digest
from common.sharding import batch_partition_spec, param_partition_specs
from common.spec import AXES, MeshSpec, ModelSpec, SpecError


def set_cpu_device_count(n: int) -> None:
    """Fake CPU devices for a mesh, unless the user fixed the count (then a mismatch is reported).
    Must run before JAX initialises its backends."""
    if (
        "JAX_NUM_CPU_DEVICES" in os.environ
        or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
    ):
        return
    jax.config.update("jax_num_cpu_devices", n)


JAX_EXTRAS = {"cuda": "jax[cuda12]", "gpu": "jax[cuda12]", "rocm": "jax[rocm]", "tpu": "jax[tpu]"}


def check_platform() -> None:
    """Every platform JAX_PLATFORMS names must be there: one that is not is a usage error naming the
    variable and the fix, not a crash in the first device call (JAX skips a `cuda` it finds no GPU
    for and then fails with a bare AssertionError). Initialises JAX's backends: call it after
    set_cpu_device_count and initialize_distributed, which must come first."""
    value = os.environ.get("JAX_PLATFORMS", "")
    wanted = [p.strip() for p in value.split(",") if p.strip()]
    if not wanted:
        return
    try:
        jax.devices()
        missing = []
        for platform in wanted:
            try:
                jax.devices(platform)
            except RuntimeError:
                missing.append(platform)
    except (RuntimeError, AssertionError):
        missing = wanted
    if missing:
        extra = JAX_EXTRAS.get(missing[0].lower(), f"the jax plugin for {missing[0]}")
        raise SpecError(
            f"JAX_PLATFORMS={value} selects a platform this machine does not have (jax sees: "
            f"{_platforms_without_the_variable()}); unset it, or install {extra} where that "
            "hardware is"
        )


def _platforms_without_the_variable() -> str:
    """What JAX finds here on its own (asked in a fresh interpreter: this one's backends are
    set)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import jax; print(jax.default_backend())"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def join(spec, options) -> bool:
    """This process's fake CPU devices and its place in a multi-process run (each process holds an
    equal share of the mesh's devices), before JAX initialises; returns whether it writes the record
    (process 0)."""
    processes = options.own.num_processes
    if processes < 1 or spec.mesh.device_count % processes:
        raise SpecError(
            f"--num-processes {processes}: a mesh of {spec.mesh.device_count} devices cannot be "
            "split "
            "evenly over the processes; give a mesh whose device count they divide"
        )
    set_cpu_device_count(spec.mesh.device_count // processes)
    initialize_distributed(options.own.coordinator, processes, options.own.process_id)
    check_platform()  # a JAX_PLATFORMS this machine lacks: one line and exit 2, not a crash
    global RUN
    if processes > 1:  # the number every process's shard files carry (common/files/shards.py)
        from jax.experimental import multihost_utils

        check_same_settings(spec, processes)
        RUN = int(
            multihost_utils.broadcast_one_to_all(np.int32(np.random.default_rng().integers(2**31)))
        )
    return jax.process_index() == 0


def check_same_settings(spec, processes: int) -> None:
    """Every process of the run was given the same training settings and mesh (hosts given other
    --steps would wait on each other's collectives until --timeout): each one's digest, gathered by
    all (common/multiprocess.py)."""
    from jax.experimental import multihost_utils

    digest = np.int32(settings_digest(spec))
    if len(set(np.asarray(multihost_utils.process_allgather(digest)).ravel().tolist())) > 1:
        raise other_settings(spec, processes, jax.process_index())


def initialize_distributed(
    coordinator: str | None, num_processes: int | None, process_id: int | None
) -> None:
    """Join a multi-process run: explicit coordinator flags, or automatic on a TPU pod slice. A
    process other than 0 first waits for the coordinator to accept a connection: one it cannot reach
    is one line naming it, not jax's abort with a native stack after five minutes."""
    if coordinator:
        # how long a process waits for its coordinator to answer (XLA_TWINS_COORDINATOR_WAIT_S):
        # jax's own default ends in a native abort
        wait_s = coordinator_wait_s()
        refuse_taken_port(coordinator, process_id or 0)
        waited = wait_for_coordinator(coordinator, process_id or 0, wait_s)
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=int(wait_s - waited) + 1,
        )


def wait_for_coordinator(address: str, process_id: int, seconds: float) -> float:
    """Seconds spent until `address` (host:port) accepted a TCP connection; process 0 serves it, no
    wait."""
    import socket
    import time

    if process_id == 0:
        return 0.0
    host, _, port = address.rpartition(":")
    start = time.monotonic()
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            return time.monotonic() - start
        except OSError as e:
            if time.monotonic() - start > seconds:
                raise SpecError(
                    f"process {process_id} cannot reach the coordinator {address} within "
                    f"{seconds:g} s "
                    f"({e.strerror or e}): host 0 not started, another --coordinator, or a "
                    "firewall "
                    "between the hosts"
                ) from None
            time.sleep(0.25)


def make_mesh(mesh: MeshSpec) -> Mesh:
    devices = jax.devices()
    if len(devices) != mesh.device_count:
        raise SpecError(
            f"mesh data={mesh.data},fsdp={mesh.fsdp},tensor={mesh.tensor} needs "
            f"{mesh.device_count} "
            f"devices; this platform has {len(devices)} ({devices[0].platform}); change --mesh"
        )
    grid = np.array(devices).reshape(mesh.data, mesh.fsdp, mesh.tensor)
    global MESH
    MESH = Mesh(grid, AXES, axis_types=(AxisType.Auto,) * len(AXES))
    return MESH


MESH: Mesh | None = None  # the run's mesh, once made: what a twin's nnx_mesh_arg is given


@contextlib.contextmanager
def one_device_mesh():
    """MESH the run's axes on one device inside (a twin's regions then run whole: the probe that
    tells a mesh its model's sizes do not divide from a forward that fails anyway)."""
    global MESH
    before = MESH
    MESH = Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), AXES, axis_types=(AxisType.Auto,) * 3)
    try:
        yield MESH
    finally:
        MESH = before


def param_shardings(model: ModelSpec, mesh_spec: MeshSpec, mesh: Mesh) -> dict[str, NamedSharding]:
    return {
        name: NamedSharding(mesh, PartitionSpec(*spec))
        for name, spec in param_partition_specs(model, mesh_spec).items()
    }


def batch_sharding(mesh_spec: MeshSpec, mesh: Mesh, ndim: int) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(*batch_partition_spec(mesh_spec, ndim)))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


class StepBatch(NamedTuple):
    """What a jitted step takes as its batch: the batch on the devices and, when the run is fed
    common's dropout masks (common/data/masks.py), the step's masks in call order."""

    inputs: jax.Array
    targets: jax.Array
    masks: tuple = ()


def put_batch(batch: Batch, mesh_spec: MeshSpec, mesh: Mesh, masks: tuple = ()) -> StepBatch:
    """A global batch as sharded device arrays. Every process holds the whole global batch (drawn
    alike in each), so each device's shard is cut from it where the sharding places it: a process
    whose devices share rows with another's (a mesh split over processes along "tensor") feeds the
    same rows, by construction rather than by an assumed device order. Dropout masks go replicated
    (every process draws all of them)."""
    masks = tuple(jax.device_put(m, replicated(mesh)) for m in masks)
    shardings = tuple(
        jax.tree.map(lambda a: batch_sharding(mesh_spec, mesh, a.ndim), part) for part in batch
    )
    if jax.process_count() == 1:
        return StepBatch(*jax.tree.map(jax.device_put, tuple(batch), shardings), masks)
    return StepBatch(
        *jax.tree.map(
            lambda a, s: jax.make_array_from_callback(a.shape, s, lambda index: a[index]),
            tuple(batch),
            shardings,
        ),
        masks,
    )


def place(x, target: NamedSharding):
    """`x` committed to `target`. In a multi-process run a value this process holds whole (host or
    one device) goes from the host, each process putting its own shards (a PRNG key by its key
    data)."""
    if jax.process_count() == 1 or (isinstance(x, jax.Array) and not x.is_fully_addressable):
        return jax.device_put(x, target)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(
            place(jax.random.key_data(x), target), impl=jax.random.key_impl(x)
        )
    return jax.device_put(np.asarray(x), target)


RUN = 0  # this run's number, drawn by process 0 (join)


def whole(x):
    """A tensor kept whole: on the host when this process holds all of it, else this process's
    distinct shards (the replica 0 of each), which it writes itself: the tensor is never assembled
    in one process."""
    if jax.process_count() == 1 or x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    pieces = []
    for shard in x.addressable_shards:
        if shard.replica_id == 0:
            values = np.asarray(shard.data)
            # bfloat16: as float32
            values = values if values.dtype.kind in "biuf" else values.astype(np.float32)
            pieces.append((_where(shard.index, x.shape), values))
    return ShardedTensor(
        tuple(x.shape), tuple(pieces), jax.process_index(), jax.process_count(), RUN
    )


def to_host(x) -> np.ndarray:
    """A (possibly multi-process sharded) array gathered to a numpy array on every process."""
    if jax.process_count() > 1 and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def device_copies(x) -> list[tuple[int, tuple, np.ndarray]]:
    """(device id, where its block lies, its values) for every device's copy of `x`, every
    process's devices included: gathered (a collective every process makes) when some are
    another process's. Blocks of unequal shapes cannot be stacked to gather: only this process's
    devices then."""
    shards = sorted(x.addressable_shards, key=lambda s: s.device.id)
    mine = [(s.device.id, _where(s.index, x.shape), np.asarray(s.data)) for s in shards]
    if x.is_fully_addressable:
        return mine
    placed = x.sharding.devices_indices_map(x.shape)
    blocks = {tuple(stop - start for start, stop in _where(i, x.shape)) for i in placed.values()}
    if len(blocks) != 1:
        return mine
    from jax.experimental import multihost_utils

    devices = sorted(placed, key=lambda d: d.id)
    rows = NamedSharding(Mesh(np.array(devices), ("device",)), PartitionSpec("device"))
    stacked = jax.make_array_from_single_device_arrays(
        (len(devices), *blocks.pop()), rows, [s.data[None] for s in shards]
    )
    every = np.asarray(multihost_utils.process_allgather(stacked, tiled=True))
    return [(d.id, _where(placed[d], x.shape), every[i]) for i, d in enumerate(devices)]


def _where(index: tuple, shape: tuple) -> tuple:
    """A shard's index (slices) as (start, stop) per axis."""
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def scalar_to_host(x) -> float:
    """A scalar (the loss) as a Python float: `float()` directly when this process holds it (~10 us
    per call here, against ~40 us through `device_get`), gathered otherwise."""
    return float(x) if x.is_fully_addressable else float(to_host(x))

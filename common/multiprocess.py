"""What the processes of one multi-process run (compare --processes, several hosts) must share: the
training settings and the mesh. Each process digests its own; every backend that runs as several
processes gathers the digests over its own collectives (jax.distributed, torch.distributed's gloo)
and refuses, at once and in every process, a run whose processes were given other settings (they
would wait on each other's collectives until --timeout)."""

from __future__ import annotations

import errno
import hashlib
import json
import socket

from common.spec import RunSpec, SpecError


def settings_digest(spec: RunSpec) -> int:
    """A 28-bit digest of the spec's training settings and mesh (fits any framework's int32)."""
    ours = spec.to_dict()
    text = json.dumps({"train": ours["train"], "mesh": ours["mesh"]}, sort_keys=True)
    return int(hashlib.sha256(text.encode()).hexdigest()[:7], 16)


def other_settings(spec: RunSpec, processes: int, process: int) -> SpecError:
    """The refusal of a run whose `processes` were given other settings, said by process
    `process`."""
    mesh = f"data={spec.mesh.data},fsdp={spec.mesh.fsdp},tensor={spec.mesh.tensor}"
    return SpecError(
        f"the {processes} processes of this run were given other training settings (this one, "
        "process "
        f"{process}: train.steps={spec.train.steps}, train.dtype={spec.train.dtype}, --mesh "
        f"{mesh}); run "
        "the same command with the same flags on every host"
    )


def refuse_per_rank_processes(spec: RunSpec, processes: int) -> None:
    """A twin whose torch side is per-rank code (its NNX side takes the mesh, nnx_mesh_arg) runs
    that code as one process holding every rank or one process per device of the mesh: refused
    otherwise, naming both."""
    from common.twin import twin_of

    devices = spec.mesh.device_count
    if processes in (1, devices) or twin_of(spec.model).nnx_mesh_arg is None:
        return
    raise SpecError(
        f"--processes {processes}: eager torch runs a twin's per-rank torch side (its NNX side "
        f"takes the mesh, nnx_mesh_arg) as one rank per device of the mesh {spec.mesh.strategy}: "
        f"give --processes {devices}, or none (every rank on one process)"
    )


def refuse_taken_port(address: str, process_id: int) -> None:
    """Process 0 serves the run's coordinator at `address` (host:port): a port another program (or
    another run) holds is one line naming it and the fix, before the framework tries and ends on its
    own log line (jax.distributed, torch.distributed's TCPStore)."""
    if process_id != 0:
        return
    host, _, port = address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:  # where the framework's server listens: every interface
            probe.bind(("", int(port)))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                return  # anything else is the framework's to say
            raise SpecError(
                f"--coordinator {address}: port {port} is taken on this host (another run, or "
                "another program, listens there); give a free port (a multi-host run's launches "
                "take the ports after it too), or leave --coordinator out on one host"
            ) from None

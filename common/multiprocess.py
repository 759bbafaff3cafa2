"""What the processes of one multi-process run (compare --processes, several hosts) must share: the
training settings and the mesh. Each process digests its own; every backend that runs as several
processes gathers the digests over its own collectives (jax.distributed, torch.distributed's gloo)
and refuses, at once and in every process, a run whose processes were given other settings (they
would wait on each other's collectives until --timeout)."""

from __future__ import annotations

import hashlib
import json

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

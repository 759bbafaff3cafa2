"""What a start carries besides its parameters, in the canonical start file (compare's prepared
start/init.safetensors, or a canonical checkpoint), read by every backend into its model's own
(torch_impl/convert.py and jax_impl/convert.py `load_state`), and what the run record says of a
start (`start_info`):
- BatchNorm's running statistics of a full torch state_dict, `state/<NNX module>.mean` and `.var`
  (float32);
- the checkpoint's other buffers that both sides hold (linked by name, common/twin/start_state.py),
  `buffer/<NNX Variable>`, as the checkpoint held them (16-bit floats widened), their torch names in
  the file's metadata (`BUFFER_NAMES`): input statistics, EMA weights, persistent tables and masks.
Numpy only."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from common.weights import (
    BUFFER_PREFIX,
    STATE_PREFIX,
    CheckpointError,
    conversion_note,
    param_arrays,
    read_safetensors,
    require_regular_file,
)
from common.weights.checkpoint_ref import CheckpointRef

# the start compare prepares for the backends (compare/runs/prepare.py)
INIT_FILE = "init.safetensors"
# the start file's metadata: JSON {NNX Variable name: torch buffer name}
BUFFER_NAMES = "buffer_torch_names"


@dataclass(frozen=True)
class StartState:
    # {canonical state name: float32 array}
    statistics: dict[str, np.ndarray] = field(default_factory=dict)
    buffers: dict[str, np.ndarray] = field(default_factory=dict)  # {NNX Variable name: array}
    # {NNX Variable name: torch buffer name}
    torch_names: dict[str, str] = field(default_factory=dict)


def start_state(checkpoint: CheckpointRef | None) -> StartState:
    """The state a start carries; empty for none (the model's own init, or a checkpoint of
    parameters only)."""
    checkpoint = CheckpointRef.of(checkpoint)
    path = checkpoint.canonical_path if checkpoint else None
    if not path:
        return StartState()
    require_regular_file(path, "checkpoint", CheckpointError)
    source = f"checkpoint {path}"
    arrays, dtypes, metadata = read_safetensors(path, source)
    stats = param_arrays(
        {k: v for k, v in arrays.items() if k.startswith(STATE_PREFIX)}, dtypes, source
    )
    buffers = {}
    for key, value in arrays.items():
        # 16-bit floats (a checkpoint of the user's own) widened to float32
        if key.startswith(BUFFER_PREFIX):
            buffers[key.removeprefix(BUFFER_PREFIX)] = (
                param_arrays({key: value}, dtypes, source)[key]
                if dtypes[key] in ("bfloat16", "float16")
                else value
            )
    try:
        torch_names = json.loads(metadata.get(BUFFER_NAMES, "{}"))
    except ValueError:
        torch_names = None
    if not isinstance(torch_names, dict):
        raise CheckpointError(
            f"{source}: its metadata's {BUFFER_NAMES} is not a JSON object of names; start from "
            "the torch checkpoint itself"
        )
    for name, value in buffers.items():  # an infinity may be the model's own (a causal mask)
        if np.asarray(value).dtype.kind == "f" and np.isnan(value).any():
            raise CheckpointError(
                f"{source}: buffer {name} holds {int(np.isnan(value).sum())} NaN values; a start "
                "must be finite where the model is (the checkpoint of a run that diverged?)"
            )
    unnamed = sorted(name for name in buffers if name not in torch_names)
    if unnamed:
        raise CheckpointError(
            f"{source}: buffer {unnamed[0]} has no torch name in the file's metadata "
            f"({BUFFER_NAMES}); start from the torch checkpoint itself"
        )
    return StartState(
        {k.removeprefix(STATE_PREFIX): v for k, v in stats.items()},
        buffers,
        {name: torch_names[name] for name in buffers},
    )


def carried_buffers(buffers: dict[str, np.ndarray], links: dict[str, str]) -> dict[str, np.ndarray]:
    """A full state_dict's buffers (torch_impl/describe.py's TORCH_BUFFERS) that both sides hold
    ({torch name: NNX name}, `links`), as the start file keeps them ({`buffer/<NNX name>`: array});
    the metadata that names them on the torch side is `buffer_metadata`'s."""
    return {
        BUFFER_PREFIX + links[name]: np.asarray(value)
        for name, value in buffers.items()
        if name in links
    }


def buffer_metadata(buffers: dict[str, np.ndarray], links: dict[str, str]) -> dict[str, str]:
    """The start file's metadata naming each carried buffer on the torch side ({} for none)."""
    names = {nnx: torch for torch, nnx in links.items() if torch in buffers}
    return {BUFFER_NAMES: json.dumps(names)} if names else {}


def start_info(checkpoint: CheckpointRef | None, seconds: float) -> dict:
    """The run record's `extra.start`: where the weights came from, what reading them and converting
    them to the runtime's layout cost, and (`converted`) the dtypes a canonical checkpoint was
    converted from."""
    checkpoint = CheckpointRef.of(checkpoint)
    info = {
        "from": str(checkpoint) if checkpoint else "the canonical init (common/weights/)",
        "load_and_convert_s": seconds,
    }
    path = checkpoint.canonical_path if checkpoint else None
    if path and str(path).endswith(".safetensors"):
        try:
            _, dtypes, metadata = read_safetensors(path, f"checkpoint {path}", header_only=True)
            info["converted"] = conversion_note(
                {k: d for k, d in dtypes.items() if not k.startswith(BUFFER_PREFIX)}
            ) or metadata.get("converted")
            stats = sum(1 for name in dtypes if name.startswith(STATE_PREFIX))
            info["running_statistics"] = (
                f"{stats} from the checkpoint" if stats else "the model's own init"
            )
            buffers = sum(1 for name in dtypes if name.startswith(BUFFER_PREFIX))
            if buffers:
                info["buffers"] = f"{buffers} from the checkpoint"
            if metadata.get("not_carried"):
                info["not_carried"] = metadata["not_carried"]
        except CheckpointError:
            pass  # read (and refused) by load_checkpoint already
    return info

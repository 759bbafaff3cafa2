"""A twin's start state: what each side's factory builds besides its parameters (torch buffers; NNX
Variables that are neither Params nor running statistics nor RNG state), by name: rotary tables,
position ids, masks, EMA weights. Each describe step writes its side's (`TORCH_STATE`, `NNX_STATE`);
compare links them by name as it links parameters (the twin's `rename`, then the path compared as
`normalised_path` does) and judges them before anything trains (compare/judge/start_state.py), and
after training where they are numbers (the tensor file's `buffers`: `by_nnx_names`). Running
statistics are not here: they are carried from the torch side (common/weights/ STATE_PREFIX) and
compared as they train. Numpy only."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from common.twin.correspond import normalised_path, renamed

TORCH_STATE = "torch_state.safetensors"
NNX_STATE = "nnx_state.safetensors"
# {"links": {torch name: NNX name}, "torch_only": [...], "nnx_only": [...]}
STATE_LINKS = "start_state.json"


def storable(value) -> np.ndarray | None:
    """A state value as its file keeps it: floats of 16 bits widened to float32 (exactly), other
    numbers and booleans as they are; None for what is not an array of numbers (an object, a complex
    number)."""
    array = np.asarray(value)
    if array.dtype.name in ("bfloat16", "float16"):
        return array.astype(np.float32)
    return array if array.dtype.kind in "fiub" else None


def link_state(torch_names: list[str], nnx_names: list[str], rename: Mapping[str, str]) -> dict:
    """Each torch buffer linked to the one NNX Variable of its path (the twin's renames applied,
    compared as parameter paths are); the ones on one side only listed (they are not compared)."""
    by_path: dict[str, list[str]] = {}
    for name in nnx_names:
        by_path.setdefault(normalised_path(name), []).append(name)
    links, torch_only = {}, []
    for name in torch_names:
        found = by_path.get(normalised_path(renamed(name, rename)), [])
        if len(found) == 1 and found[0] not in links.values():
            links[name] = found[0]
        else:
            torch_only.append(name)
    return {
        "links": links,
        "torch_only": torch_only,
        "nnx_only": [n for n in nnx_names if n not in links.values()],
    }


def read_links(start_dir: Path) -> dict[str, str]:
    """{torch buffer name: NNX Variable name} of a twin's start state (STATE_LINKS); {} where none
    was linked (a built-in model, or one side not described)."""
    path = Path(start_dir) / STATE_LINKS
    return json.loads(path.read_text())["links"] if path.exists() else {}


def by_nnx_names(buffers: Mapping, links: Mapping[str, str]) -> dict:
    """A torch runtime's buffers after training ({torch name: array}: the tensor file's `buffers`
    group) under the NNX names their start state links them to, so that they are compared with the
    NNX side's as parameters are; a buffer with no link keeps its torch name (compared with another
    torch runtime's only)."""
    linked = set(links.values())
    return {
        links.get(name, name): buffers[name]
        for name in buffers
        if name in links or name not in linked
    }

"""The common start of every backend, prepared before any backend trains (and before a run directory
exists): a user twin's torch initialisation, or a torch / Hugging Face checkpoint (`--checkpoint`).

The sides describe themselves in their own interpreters (one process describes both where both have
the same one: driver/describe_sides.py; else they run in parallel): the torch side writes its
parameter tree and its start weights in torch names (`python -m torch_impl.describe`: the factory's
initialisation, or the checkpoint it loads and checks), a user twin's NNX side its parameter tree,
which is the canonical one (`python -m jax_impl.describe`; a built-in twin's is `param_infos`).
Here, with numpy only, the correspondence is derived (`common.twin.correspond`), so a tree that does
not match fails now, listing every unmatched tensor, and the start weights are carried to the
canonical layout, so every backend starts bit-identical. The result is a folder the backends read:
`spec.json` (the spec with a user twin's canonical tree), `init.safetensors`, `correspondence.json`
(for the user to read), and the two trees.

A side whose describe step can go on to make a backend's run (`runs`: compare/runs/launch.py
describing_runs) is described in a process of its own that then waits (`--wait-for-run`) and is
handed to that run (compare/runs/orchestrate.py run_backend): one interpreter per side, its
framework imported and its twin file run once.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
from safetensors.numpy import load_file

from common.files.fsutil import write_json_atomic
from common.files.record import SPEC_FILE
from common.spec import RunSpec, TwinSpec
from common.twin import TwinError, hf, load_twin, no_bfloat16_refusal, twin_of
from common.twin.correspond import declared_layouts, derive
from common.twin.modules import module_map, state_names
from common.twin.start_state import NNX_STATE, STATE_LINKS, TORCH_STATE, link_state
from common.vocab import CheckpointFormat
from common.weights import (
    STATE_PREFIX,
    CheckpointError,
    conversion_note,
    load_checkpoint,
    param_arrays,
    param_infos,
    read_safetensors,
    save_checkpoint,
)
from common.weights.carried import INIT_FILE, buffer_metadata, carried_buffers
from common.weights.checkpoint_ref import CheckpointRef
from common.weights.checkpoints import TORCH_BUFFERS
from compare.runs.describe_steps import FAMILY_OF_SIDE, Step, model_name, start_step, wait_step


class Prepared(NamedTuple):
    spec: RunSpec  # with a user twin's canonical tree
    # init.safetensors and spec.json; None when the backends read the checkpoint as it is
    folder: Path | None
    waiting: dict[str, Step]  # {backend: the described process that waits to make its run}


def weights_origin(spec: RunSpec, checkpoint: CheckpointRef | None) -> str:
    """Where a run's start weights come from, in words (report.json's `weights`, said in
    report.md)."""
    carried = f"carried to every backend as {INIT_FILE}"
    if checkpoint:
        fmt, path = checkpoint.format, checkpoint.path
        read_once = fmt in (CheckpointFormat.TORCH, CheckpointFormat.HF) or isinstance(
            spec.model, TwinSpec
        )
        return f"the {fmt.value} checkpoint {path}" + (
            f", read once by compare and {carried}" if read_once else ""
        )
    if isinstance(spec.model, TwinSpec):
        return (
            f"the torch side's own initialisation of twin {spec.model.twin} "
            f"(train.seed={spec.train.seed}), "
            f"{carried}"
        )
    return (
        f"the canonical init (common/weights/, train.seed={spec.train.seed}), built alike by "
        "every backend"
    )


def prepare_start(
    spec: RunSpec,
    checkpoint: CheckpointRef | None,
    torch_python: str,
    jax_python: str,
    timeout_s: float,
    runs: dict[str, str] | None = None,
    variants: dict[str, dict[str, RunSpec]] | None = None,
    nnx_bfloat16: bool = False,
) -> Prepared:
    """What every backend starts from, when it is not the built-in canonical init: a user twin's
    torch initialisation, or a torch / Hugging Face checkpoint: the spec (with a user twin's
    canonical tree), a temporary folder with `init.safetensors` and `spec.json` (None when the
    backends can read `checkpoint` as it is), and the described processes that wait to make a run
    (`runs`: {family: backend}; the caller hands each to its run or stops it). `variants`: {family:
    {backend: its spec}} whose other model each side's describe step builds too; `nnx_bfloat16`: a
    backend runs the NNX side in bfloat16 (a twin must give its compute dtype). Raises a one-line
    input error and leaves nothing behind."""
    fmt, path = (checkpoint.format, checkpoint.path) if checkpoint else (None, None)
    user_twin = isinstance(spec.model, TwinSpec)
    if not user_twin and fmt in (None, CheckpointFormat.CANONICAL):
        if path:
            load_checkpoint(path, spec.model)  # checked here, before any backend starts
        return Prepared(spec, None, {})
    if fmt == CheckpointFormat.ORBAX:
        raise CheckpointError(
            f"--checkpoint {checkpoint}: convert an orbax checkpoint first (python -m "
            "compare.convert --from orbax:DIR --to canonical:FILE)"
        )
    twin = (
        load_twin(spec.model.twin, frameworks_allowed=False, timeout_s=timeout_s)
        if user_twin
        else twin_of(spec.model)
    )
    if user_twin and nnx_bfloat16 and not twin.nnx_dtype_arg:  # before the torch side trains
        raise no_bfloat16_refusal(spec.model.twin)
    if user_twin and twin.init != "torch":
        raise TwinError(
            f"twin {spec.model.twin}: init={twin.init!r}; a user twin starts from its torch "
            "initialisation (init='torch')"
        )
    if fmt == CheckpointFormat.HF:  # fails fast, before any process starts
        hf.check_config(hf.read_config(path), spec.model, twin, f"hf checkpoint {path}")
    folder, steps = None, []
    # every exit but success (an input error, a timeout, Ctrl-C / SIGTERM
    # in compare) removes the folder
    try:
        # and leaves no describe process
        folder = Path(tempfile.mkdtemp(prefix="xla-twins-prepare-"))
        sides = _side_flags(spec, fmt, path, folder, variants or {})
        _start_steps(spec, sides, folder, torch_python, jax_python, runs or {}, steps)
        for step in steps:
            wait_step(step, folder, spec, timeout_s)
        for other in folder.glob("spec-*.json"):  # read by the describe steps alone
            other.unlink()
        prepared = _convert(spec, twin, fmt, path, folder)
    except BaseException:
        for step in steps:
            step.stop()
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    waiting = {step.runs: step for step in steps if step.runs and step.proc.poll() is None}
    for step in steps:
        if step.runs not in waiting:
            step.stop()
    return Prepared(prepared, folder, waiting)


def _side_flags(spec, fmt, path, folder: Path, variants: dict) -> dict[str, list[str]]:
    """{side: its describe step's own flags}: the torch side's checkpoint to load, and each side's
    backends' other models (`--also-spec BACKEND=PATH`, their specs written into `folder`)."""
    flags = {"torch": []}
    if fmt in (CheckpointFormat.TORCH, CheckpointFormat.HF):
        flags["torch"] += ["--load", f"{fmt}:{path.resolve()}"]
    if isinstance(spec.model, TwinSpec):
        flags["NNX"] = []
    for side in flags:
        for backend, other in variants.get(FAMILY_OF_SIDE[side], {}).items():
            write_json_atomic(folder / f"spec-{backend}.json", other.to_dict())
            flags[side] += ["--also-spec", f"{backend}={folder / f'spec-{backend}.json'}"]
    return flags


def _start_steps(
    spec, sides: dict, folder: Path, torch_python, jax_python, runs: dict[str, str], steps: list
) -> None:
    """The describe steps of `sides` ({side: its flags}), started into `steps` (each as it starts: a
    failed start leaves none unstopped): a side that goes on to make a run (`runs`) in a process of
    its own; the others sharing an interpreter in one."""
    write_json_atomic(folder / SPEC_FILE, spec.to_dict())
    pythons = {"torch": torch_python, "NNX": jax_python}
    by_python = {}
    for side, flags in sides.items():
        python = pythons[side]
        if FAMILY_OF_SIDE[side] in runs:
            steps.append(
                start_step(
                    python, [(side, flags)], folder / SPEC_FILE, folder, runs[FAMILY_OF_SIDE[side]]
                )
            )
        else:
            by_python.setdefault(python, []).append((side, flags))
    for python, group in by_python.items():
        steps.append(start_step(python, group, folder / SPEC_FILE, folder))


def _convert(spec, twin, fmt, path, folder: Path) -> RunSpec:
    """From both sides' descriptions in `folder`: the correspondence, the start weights in the
    canonical layout, and the spec with a user twin's canonical tree."""
    user_twin = isinstance(spec.model, TwinSpec)
    canonical = (
        _read_json(folder / "nnx_params.json")
        if user_twin
        else {name: list(info.shape) for name, info in param_infos(spec.model).items()}
    )
    torch_params = _read_json(folder / "torch_params.json")
    empty = [
        f"the {side} model ({factory})"
        for side, tree, factory in (
            ("torch", torch_params, twin.torch),
            ("NNX", canonical, twin.nnx),
        )
        if not tree
    ]
    if empty:
        raise TwinError(
            f"{model_name(spec)}: {' and '.join(empty)} has no parameters; a twin trains and "
            "compares "
            "parameters: return the whole model from the factory, its weights registered as "
            "nn.Parameter / nnx.Param"
        )
    link_start_state(folder, twin.rename)
    weights = _read_json(folder / "torch_weights.json")
    kinds = {
        "torch_kinds": _read_json(folder / "torch_modules.json"),
        "nnx_kinds": _read_json(folder / "nnx_modules.json") if user_twin else {},
        "torch_orientations": weights.get("orientations", {}),
        "torch_ties": weights.get("ties", {}),
    }
    corr = derive(
        torch_params,
        canonical,
        packed=twin.packed,
        rename=twin.rename,
        layouts=declared_layouts(twin.layouts, canonical),
        **kinds,
    )
    write_json_atomic(
        folder / "correspondence.json",
        [
            {
                k: v
                for k, v in dataclasses.asdict(link).items()
                # where they apply (a packed tensor's axis where it is not its rows)
                if k not in ("flat", "rows", "axis") or v
            }
            for link in corr.links
        ],
    )
    prepared = (
        dataclasses.replace(
            spec, model=dataclasses.replace(spec.model, params=canonical, layouts=corr.decided)
        ).validate()
        if user_twin
        else spec
    )
    metadata = {}
    if fmt == CheckpointFormat.CANONICAL:
        # float32: converted once (common.weights.param_arrays)
        init = load_checkpoint(path, prepared.model)
        source = f"canonical checkpoint {path}"
        converted = conversion_note(read_safetensors(path, source, header_only=True)[1])
        # the backends read the float32 start; their records say what it was converted from
        if converted:
            metadata["converted"] = converted
    else:
        init = corr.to_canonical(load_file(str(folder / "torch_init.safetensors")))
        source = (
            f"{fmt} checkpoint {path}"
            if fmt
            else f"torch initialisation of {spec.model.twin}, seed {spec.train.seed}"
        )
        # NaN: refused
        init = param_arrays(init, {k: str(np.asarray(v).dtype) for k, v in init.items()}, source)
        init = {k: np.asarray(v, np.float32) for k, v in init.items()}
        if (folder / TORCH_BUFFERS).exists():
            init, more = _with_buffers(
                init, load_file(str(folder / TORCH_BUFFERS)), folder, canonical, twin.rename, source
            )
            metadata.update(more)
    save_checkpoint(folder / INIT_FILE, init, metadata={"source": source, **metadata})
    write_json_atomic(folder / SPEC_FILE, prepared.to_dict())
    return prepared


def link_start_state(folder: Path, rename: dict) -> None:
    """Both sides' start state described (a user twin): each torch buffer linked to its NNX Variable
    by name, into STATE_LINKS, which compare/judge/start_state.py judges; nothing where one side was
    not described."""
    paths = folder / TORCH_STATE, folder / NNX_STATE
    if all(p.exists() for p in paths):
        names = [list(read_safetensors(p, f"start state {p}", header_only=True)[1]) for p in paths]
        write_json_atomic(folder / STATE_LINKS, link_state(*names, rename))


def _with_buffers(
    init: dict, buffers: dict, folder: Path, canonical: dict, rename: dict, source: str
) -> tuple[dict, dict]:
    """The start file's tensors with a full state_dict's buffers carried
    (common/weights/carried.py): its running statistics, and the buffers linked to an NNX Variable
    of their size (STATE_LINKS; none for a built-in model: a pair of other sizes is judged as built,
    and differs); and the metadata that names them and says what is not carried."""
    links = (
        json.loads((folder / STATE_LINKS).read_text())["links"]
        if (folder / STATE_LINKS).exists()
        else {}
    )
    if links:
        held = load_file(str(folder / NNX_STATE))
        links = {
            t: n for t, n in links.items() if t in buffers and np.size(buffers[t]) == held[n].size
        }
    state, left = running_statistics(buffers, canonical, rename, source)
    left = sorted(set(left) - set(links))
    init = {
        **init,
        **{STATE_PREFIX + k: v for k, v in state.items()},
        **carried_buffers(buffers, links),
    }
    metadata = buffer_metadata(buffers, links)
    if left:
        metadata["not_carried"] = f"{len(left)} torch-only buffer(s): {', '.join(left[:5])}" + (
            " ..." if len(left) > 5 else ""
        )
    return init, metadata


def running_statistics(
    buffers: dict, canonical: dict, rename: dict, source: str
) -> tuple[dict, list[str]]:
    """A full state_dict's BatchNorm running statistics by canonical state name (float32, checked
    like every start tensor), and the other buffers' names (`num_batches_tracked`, and buffers of
    other modules)."""
    modules = module_map(sorted({name.rpartition(".")[0] for name in buffers}), canonical, rename)
    names = state_names(list(buffers), modules)
    state = {names[k]: np.asarray(v, np.float32) for k, v in buffers.items() if k in names}
    state = param_arrays(state, {k: "float32" for k in state}, source)
    return state, sorted(set(buffers) - set(names))


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text())

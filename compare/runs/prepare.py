"""The common start of every backend, prepared before any backend trains (and before a run directory
exists): a user twin's torch initialisation, or a torch / Hugging Face checkpoint (`--checkpoint`).

The sides describe themselves in their own interpreters (one process describes both where both have the
same one: driver/describe_sides.py; else they run in parallel): the torch side writes its
parameter tree and its start weights in torch names (`python -m torch_impl.describe`: the factory's
initialisation, or the checkpoint it loads and checks), a user twin's NNX side its parameter tree,
which is the canonical one (`python -m jax_impl.describe`; a built-in twin's is `param_infos`). Here,
with numpy only, the correspondence is derived (`common.correspond`), so a tree that does not match
fails now, listing every unmatched tensor, and the start weights are carried to the canonical layout,
so every backend starts bit-identical. The result is a folder the backends read: `spec.json` (the spec
with a user twin's canonical tree), `init.safetensors`, `correspondence.json` (for the user to read),
and the two trees.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import IO, NamedTuple

import numpy as np
from safetensors.numpy import load_file

from common import hf
from common.checkpoint_ref import CheckpointRef
from common.checkpoints import TORCH_BUFFERS
from common.correspond import declared_layouts, derive
from common.fsutil import write_json_atomic
from common.modules import module_map, state_names
from common.procs import kill_group, start_group
from common.protocol import FROM_OUTSIDE, THEN, error_line
from common.record import SPEC_FILE
from common.spec import RunSpec, TwinSpec
from common.start_state import NNX_STATE, STATE_LINKS, TORCH_STATE, link_state
from common.twin import TwinError, load_twin, twin_of
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
from compare.runs.guard import GUARD
from compare.runs.orchestrate import backend_env

INIT_FILE = "init.safetensors"


# what each side's describe step writes; a step that exits 0 without them was stopped by the user's code
SIDE_FILES = {"torch": ("torch_params.json", "torch_modules.json", "torch_init.safetensors"),
              "NNX": ("nnx_params.json", "nnx_modules.json")}


# the module that describes each side, run as `python -m` in that side's interpreter
DESCRIBERS = {"torch": "torch_impl.describe", "NNX": "jax_impl.describe"}


class Step(NamedTuple):
    proc: subprocess.Popen
    stderr: IO[str]  # an unnamed file
    sides: tuple[str, ...]  # the sides it describes, in order


def _describe(python: str, sides: list[tuple[str, list[str]]], spec_path: Path, out: Path) -> Step:
    """A describe step in its own process group (it runs the user's factories: whatever they start goes
    with it), watched by compare's guard should compare itself be killed. `sides`: [(side, its own flags)];
    several are described one after the other in one process (driver/describe_sides.py). Its stderr goes to
    an unnamed file, not a pipe, which a process the user's code starts could hold open after the step exits."""
    commands = [[DESCRIBERS[side], "--spec", str(spec_path), "--out", str(out), *extra] for side, extra in sides]
    command = ["-m", *commands[0]] if len(commands) == 1 else \
        ["-m", "driver.describe_sides", *[arg for c in commands for arg in [THEN, *c]][1:]]
    err = tempfile.TemporaryFile("w+", errors="replace")
    try:
        proc = start_group([python, *command], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                           env=backend_env())
    except OSError as e:
        err.close()
        raise TwinError(f"cannot start {python} to describe the twin ({', '.join(c[0] for c in commands)}): "
                        f"{e.strerror or e}") from None
    GUARD.watch(proc.pid)
    return Step(proc, err, tuple(side for side, _ in sides))


def _stop(step: Step) -> None:
    """The describe step's whole group killed (also after it exited: children its user code left), reaped."""
    kill_group(step.proc)
    step.stderr.close()
    GUARD.unwatch(step.proc.pid)


def _missing(side: str, folder: Path) -> list[str]:
    return [f for f in SIDE_FILES[side] if not (folder / f).is_file()]


def _wait(step: Step, folder: Path, spec: RunSpec, timeout_s: float) -> None:
    """Waits `timeout_s` per side the step describes; a failure is told of the side it was describing: the
    first whose files are not all written."""
    proc = step.proc
    try:
        proc.wait(timeout=timeout_s * len(step.sides))
        step.stderr.seek(0)
        stderr = step.stderr.read()
    except subprocess.TimeoutExpired:
        stderr = None
    side = next((s for s in step.sides if _missing(s, folder)), step.sides[-1])
    what = f"describing the {side} side of {_name(spec)}"
    if stderr is None:
        raise TwinError(f"{what} (building its model) did not finish within --timeout {timeout_s:g} s; killed with "
                        "its process group")
    if proc.returncode < 0:
        raise TwinError(f"{what} was killed by {signal.Signals(-proc.returncode).name}"
                        + (f": {said}" if (said := error_line(stderr, -proc.returncode in FROM_OUTSIDE)) else ""))
    if proc.returncode != 0:
        raise TwinError(error_line(stderr) or f"{what} exited with code {proc.returncode}")
    if _missing(side, folder):  # sys.exit(0) / os._exit(0) in the user's factory or forward
        raise TwinError(f"{what} exited with code 0 before writing {', '.join(_missing(side, folder))} (sys.exit "
                        f"or os._exit in the {side} factory or its model?); a factory must return the model")


def _name(spec: RunSpec) -> str:
    return f"twin {spec.model.twin!r}" if isinstance(spec.model, TwinSpec) else f"{spec.model.family} ({spec.name})"


def weights_origin(spec: RunSpec, checkpoint: CheckpointRef | None) -> str:
    """Where a run's start weights come from, in words (report.json's `weights`, said in report.md)."""
    carried = f"carried to every backend as {INIT_FILE}"
    if checkpoint:
        fmt, path = checkpoint.format, checkpoint.path
        read_once = fmt in (CheckpointFormat.TORCH, CheckpointFormat.HF) or isinstance(spec.model, TwinSpec)
        return f"the {fmt.value} checkpoint {path}" + (f", read once by compare and {carried}" if read_once else "")
    if isinstance(spec.model, TwinSpec):
        return (f"the torch side's own initialisation of twin {spec.model.twin} (train.seed={spec.train.seed}), "
                f"{carried}")
    return f"the canonical init (common/weights.py, train.seed={spec.train.seed}), built alike by every backend"


def prepare_start(spec: RunSpec, checkpoint: CheckpointRef | None, torch_python: str, jax_python: str,
                  timeout_s: float) -> tuple[RunSpec, Path | None]:
    """What every backend starts from, when it is not the built-in canonical init: a user twin's torch
    initialisation, or a torch / Hugging Face checkpoint. Returns (the spec, with a user twin's canonical
    tree; a temporary folder with `init.safetensors` and `spec.json`, or None when the backends can read
    `checkpoint` as it is). Raises a one-line input error and leaves nothing behind."""
    fmt, path = (checkpoint.format, checkpoint.path) if checkpoint else (None, None)
    user_twin = isinstance(spec.model, TwinSpec)
    if not user_twin and fmt in (None, CheckpointFormat.CANONICAL):
        if path:
            load_checkpoint(path, spec.model)  # checked here, before any backend starts
        return spec, None
    if fmt == CheckpointFormat.ORBAX:
        raise CheckpointError(f"--checkpoint {checkpoint}: convert an orbax checkpoint first (python -m "
                              "compare.convert --from orbax:DIR --to canonical:FILE)")
    twin = load_twin(spec.model.twin, frameworks_allowed=False, timeout_s=timeout_s) if user_twin \
        else twin_of(spec.model)
    if user_twin and twin.init != "torch":
        raise TwinError(f"twin {spec.model.twin}: init={twin.init!r}; a user twin starts from its torch "
                        "initialisation (init='torch')")
    if fmt == CheckpointFormat.HF:  # fails fast, before any process starts
        hf.check_config(hf.read_config(path), spec.model, twin, f"hf checkpoint {path}")
    folder = None
    try:  # every exit but success (an input error, a timeout, Ctrl-C / SIGTERM in compare) removes the folder
        folder = Path(tempfile.mkdtemp(prefix="xla-twins-prepare-"))
        prepared = _describe_and_convert(spec, twin, fmt, path, folder, torch_python, jax_python, timeout_s)
    except BaseException:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return prepared, folder


def _describe_and_convert(spec, twin, fmt, path, folder: Path, torch_python, jax_python, timeout_s) -> RunSpec:
    user_twin = isinstance(spec.model, TwinSpec)
    write_json_atomic(folder / SPEC_FILE, spec.to_dict())
    load = ["--load", f"{fmt}:{path.resolve()}"] if fmt in (CheckpointFormat.TORCH, CheckpointFormat.HF) else []
    by_python = {torch_python: [("torch", load)]}  # sides sharing an interpreter: described in one process
    if user_twin:
        by_python.setdefault(jax_python, []).append(("NNX", []))
    steps = []
    try:  # every exit (a failed side, a timeout, Ctrl-C / SIGTERM in compare): no describe process is left
        for python, sides in by_python.items():
            steps.append(_describe(python, sides, folder / SPEC_FILE, folder))
        for step in steps:
            _wait(step, folder, spec, timeout_s)
    finally:
        for step in steps:
            _stop(step)
    canonical = _read_json(folder / "nnx_params.json") if user_twin else \
        {name: list(info.shape) for name, info in param_infos(spec.model).items()}
    torch_params = _read_json(folder / "torch_params.json")
    empty = [f"the {side} model ({factory})" for side, tree, factory in
             (("torch", torch_params, twin.torch), ("NNX", canonical, twin.nnx)) if not tree]
    if empty:
        raise TwinError(f"{_name(spec)}: {' and '.join(empty)} has no parameters; a twin trains and compares "
                        "parameters: return the whole model from the factory, its weights registered as "
                        "nn.Parameter / nnx.Param")
    link_start_state(folder, twin.rename)
    kinds = {"torch_kinds": _read_json(folder / "torch_modules.json"),
             "nnx_kinds": _read_json(folder / "nnx_modules.json") if user_twin else {}}
    corr = derive(torch_params, canonical, packed=twin.packed, rename=twin.rename,
                  layouts=declared_layouts(twin.layouts, canonical), **kinds)
    write_json_atomic(folder / "correspondence.json", [{k: v for k, v in dataclasses.asdict(link).items()
                                                        if k not in ("flat", "rows") or v}  # where they apply
                                                       for link in corr.links])
    prepared = dataclasses.replace(spec, model=dataclasses.replace(spec.model, params=canonical,
                                                                   layouts=corr.decided)).validate() \
        if user_twin else spec
    metadata = {}
    if fmt == CheckpointFormat.CANONICAL:
        init = load_checkpoint(path, prepared.model)  # float32: converted once (common.weights.param_arrays)
        source = f"canonical checkpoint {path}"
        converted = conversion_note(read_safetensors(path, source, header_only=True)[1])
        if converted:  # the backends read the float32 start; their records say what it was converted from
            metadata["converted"] = converted
    else:
        init = corr.to_canonical(load_file(str(folder / "torch_init.safetensors")))
        source = f"{fmt} checkpoint {path}" if fmt else f"torch initialisation of {spec.model.twin}, seed " \
                                                        f"{spec.train.seed}"
        init = param_arrays(init, {k: str(np.asarray(v).dtype) for k, v in init.items()}, source)  # NaN: refused
        if (folder / TORCH_BUFFERS).exists():
            state, metadata["not_carried"] = running_statistics(load_file(str(folder / TORCH_BUFFERS)), canonical,
                                                                twin.rename, source)
            init.update({STATE_PREFIX + k: v for k, v in state.items()})
    save_checkpoint(folder / INIT_FILE, {k: np.asarray(v, np.float32) for k, v in init.items()},
                    metadata={"source": source, **metadata})
    write_json_atomic(folder / SPEC_FILE, prepared.to_dict())
    return prepared


def link_start_state(folder: Path, rename: dict) -> None:
    """Both sides' start state described (a user twin): each torch buffer linked to its NNX Variable by name, into
    STATE_LINKS, which compare/judge/start_state.py judges; nothing where one side was not described."""
    paths = folder / TORCH_STATE, folder / NNX_STATE
    if all(p.exists() for p in paths):
        names = [list(read_safetensors(p, f"start state {p}", header_only=True)[1]) for p in paths]
        write_json_atomic(folder / STATE_LINKS, link_state(*names, rename))


def running_statistics(buffers: dict, canonical: dict, rename: dict, source: str) -> tuple[dict, str]:
    """A full state_dict's BatchNorm running statistics by canonical state name (float32, checked like every
    start tensor), and what is not carried (torch-only buffers such as `num_batches_tracked`)."""
    modules = module_map(sorted({name.rpartition(".")[0] for name in buffers}), canonical, rename)
    names = state_names(list(buffers), modules)
    state = {names[k]: np.asarray(v, np.float32) for k, v in buffers.items() if k in names}
    state = param_arrays(state, {k: "float32" for k in state}, source)
    left = sorted(set(buffers) - set(names))
    return state, (f"{len(left)} torch-only buffer(s): {', '.join(left[:5])}{' ...' if len(left) > 5 else ''}"
                   if left else "")


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text())

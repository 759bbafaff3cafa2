"""The common start of every backend, prepared before any backend trains (and before a run directory
exists): a user twin's torch initialisation, or a torch / Hugging Face checkpoint (`--checkpoint`).

The sides describe themselves in their own interpreters, in parallel: the torch side writes its
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
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from common import hf
from common.checkpoints import parse_checkpoint
from common.correspond import derive
from common.fsutil import write_json_atomic
from common.spec import RunSpec, TwinSpec
from common.twin import TwinError, load_twin, twin_of
from common.vocab import CheckpointFormat
from common.weights import CheckpointError, load_checkpoint, param_infos, save_checkpoint
from compare.orchestrate import backend_env, error_line

SPEC_FILE, INIT_FILE = "spec.json", "init.safetensors"


def _describe(python: str, module: str, spec_path: Path, out: Path, extra: list[str]) -> subprocess.Popen:
    try:
        return subprocess.Popen([python, "-m", module, "--spec", str(spec_path), "--out", str(out), *extra],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=backend_env())
    except OSError as e:
        raise TwinError(f"cannot start {python} to describe the twin ({module}): {e.strerror or e}") from None


def _wait(proc: subprocess.Popen, side: str, timeout_s: float) -> None:
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise TwinError(f"describing the {side} side of the twin took over {timeout_s:g} s") from None
    if proc.returncode != 0:
        raise TwinError(error_line(stderr) or f"describing the {side} side exited with code {proc.returncode}")


def prepare_start(spec: RunSpec, checkpoint: str | None, torch_python: str, jax_python: str,
                  timeout_s: float) -> tuple[RunSpec, Path | None]:
    """What every backend starts from, when it is not the built-in canonical init: a user twin's torch
    initialisation, or a torch / Hugging Face checkpoint. Returns (the spec, with a user twin's canonical
    tree; a temporary folder with `init.safetensors` and `spec.json`, or None when the backends can read
    `checkpoint` as it is). Raises a one-line input error and leaves nothing behind."""
    fmt, path = parse_checkpoint(checkpoint) if checkpoint else (None, None)
    user_twin = isinstance(spec.model, TwinSpec)
    if not user_twin and fmt in (None, CheckpointFormat.CANONICAL):
        if path:
            load_checkpoint(path, spec.model)  # checked here, before any backend starts
        return spec, None
    if fmt == CheckpointFormat.ORBAX:
        raise CheckpointError(f"--checkpoint {checkpoint}: convert an orbax checkpoint first (python -m "
                              "compare.convert --from orbax:DIR --to canonical:FILE)")
    twin = load_twin(spec.model.twin, frameworks_allowed=False) if user_twin else twin_of(spec.model)
    if user_twin and twin.init != "torch":
        raise TwinError(f"twin {spec.model.twin}: init={twin.init!r}; a user twin starts from its torch "
                        "initialisation (init='torch')")
    if fmt == CheckpointFormat.HF:  # fails fast, before any process starts
        hf.check_config(hf.read_config(path), spec.model, twin, f"hf checkpoint {path}")
    folder = Path(tempfile.mkdtemp(prefix="xla-twins-prepare-"))
    try:
        prepared = _describe_and_convert(spec, twin, fmt, path, folder, torch_python, jax_python, timeout_s)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return prepared, folder


def _describe_and_convert(spec, twin, fmt, path, folder: Path, torch_python, jax_python, timeout_s) -> RunSpec:
    user_twin = isinstance(spec.model, TwinSpec)
    write_json_atomic(folder / SPEC_FILE, spec.to_dict())
    load = ["--load", f"{fmt}:{path.resolve()}"] if fmt in (CheckpointFormat.TORCH, CheckpointFormat.HF) else []
    sides = [("torch", torch_python, "torch_impl.describe", load)]
    if user_twin:
        sides.append(("NNX", jax_python, "jax_impl.describe", []))
    procs = {side: _describe(python, module, folder / SPEC_FILE, folder, extra)
             for side, python, module, extra in sides}
    try:
        for side, proc in procs.items():
            _wait(proc, side, timeout_s)
    finally:  # one side failed: stop the other before its files land in a folder about to go
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    canonical = _read_json(folder / "nnx_params.json") if user_twin else \
        {name: list(info.shape) for name, info in param_infos(spec.model).items()}
    corr = derive(_read_json(folder / "torch_params.json"), canonical, packed=twin.packed, rename=twin.rename)
    write_json_atomic(folder / "correspondence.json", [dataclasses.asdict(link) for link in corr.links])
    prepared = dataclasses.replace(spec, model=dataclasses.replace(spec.model, params=canonical)).validate() \
        if user_twin else spec
    if fmt == CheckpointFormat.CANONICAL:
        init = load_checkpoint(path, prepared.model)
        source = f"canonical checkpoint {path}"
    else:
        init = corr.to_canonical(load_file(str(folder / "torch_init.safetensors")))
        source = f"{fmt} checkpoint {path}" if fmt else f"torch initialisation of {spec.model.twin}, seed " \
                                                        f"{spec.train.seed}"
    save_checkpoint(folder / INIT_FILE, {k: np.asarray(v, np.float32) for k, v in init.items()},
                    metadata={"source": source})
    write_json_atomic(folder / SPEC_FILE, prepared.to_dict())
    return prepared


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text())

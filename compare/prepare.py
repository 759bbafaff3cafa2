"""A user twin's preparation, before any backend trains (and before a run directory exists).

Both sides describe themselves in their own interpreters, in parallel: the torch side writes its
parameter tree and its factory's initialisation (`python -m torch_impl.describe`), the NNX side its
parameter tree, which is the canonical one (`python -m jax_impl.describe`). Here, with numpy only, the
correspondence is derived (`common.correspond`), so a tree that does not match fails now, listing every
unmatched tensor; the torch initialisation is carried to the canonical layout, so every backend starts
bit-identical. The result is a folder the backends read: `spec.json` (the spec with the canonical tree),
`init.safetensors`, `correspondence.json` (for the user to read), and the two trees.
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

from common.correspond import derive
from common.fsutil import write_json_atomic
from common.spec import RunSpec
from common.twin import TwinError, load_twin
from common.weights import save_checkpoint
from compare.orchestrate import backend_env, error_line

SPEC_FILE, INIT_FILE = "spec.json", "init.safetensors"


def _describe(python: str, module: str, spec_path: Path, out: Path) -> subprocess.Popen:
    try:
        return subprocess.Popen([python, "-m", module, "--spec", str(spec_path), "--out", str(out)],
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


def prepare_twin(spec: RunSpec, torch_python: str, jax_python: str, timeout_s: float) -> tuple[RunSpec, Path]:
    """(the spec with its canonical tree, a temporary folder holding the preparation); the caller moves
    the folder into the run directory. Raises TwinError / CorrespondenceError (one line) and leaves
    nothing behind."""
    twin = load_twin(spec.model.twin, frameworks_allowed=False)
    if twin.init != "torch":
        raise TwinError(f"twin {spec.model.twin}: init={twin.init!r}; a user twin starts from its torch "
                        "initialisation (init='torch')")
    folder = Path(tempfile.mkdtemp(prefix="xla-twins-prepare-"))
    try:
        write_json_atomic(folder / SPEC_FILE, spec.to_dict())
        procs = {side: _describe(python, module, folder / SPEC_FILE, folder) for side, python, module in
                 (("torch", torch_python, "torch_impl.describe"), ("NNX", jax_python, "jax_impl.describe"))}
        try:
            for side, proc in procs.items():
                _wait(proc, side, timeout_s)
        finally:  # one side failed: stop the other before its files land in a folder about to go
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        torch_params = _read_json(folder / "torch_params.json")
        canonical = _read_json(folder / "nnx_params.json")
        corr = derive(torch_params, canonical, packed=twin.packed, rename=twin.rename)
        write_json_atomic(folder / "correspondence.json", [dataclasses.asdict(link) for link in corr.links])
        init = corr.to_canonical(load_file(str(folder / "torch_init.safetensors")))
        save_checkpoint(folder / INIT_FILE, {k: np.asarray(v, np.float32) for k, v in init.items()},
                        metadata={"source": f"torch initialisation of {spec.model.twin}, seed {spec.train.seed}"})
        prepared = dataclasses.replace(spec, model=dataclasses.replace(spec.model, params=canonical)).validate()
        write_json_atomic(folder / SPEC_FILE, prepared.to_dict())
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return prepared, folder


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text())

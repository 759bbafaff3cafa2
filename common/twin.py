"""A twin: one model written once in torch.nn and once in Flax NNX, and how the toolkit runs both.

Numpy only. `compare` reads a twin definition in its own process, which imports no framework; each
backend resolves the factories in its own process. A user's twin file holds only this definition (its
factories live in modules that import torch or flax):

    # my_twin.py
    from common.twin import Twin
    my_model = Twin(torch="torch_model.py:Net", nnx="nnx_model.py:Net", task="classification",
                    hparams={"input_shape": 784, "hidden": 256, "num_classes": 10})

Factories are import strings, `"package.module:callable"` or `"path/to/file.py:callable"` (relative to
the twin's file). The torch factory is called as `factory(**hparams)`, the NNX one as
`factory(**hparams, rngs=nnx.Rngs(seed))` (plus `nnx_dtype_arg=<compute dtype>` when the twin names
one). The built-in models (mlp, cnn, gpt) are twins of exactly this kind (`BUILTIN`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from common.spec import DataSpec, MeshSpec, ModelSpec, RunSpec, SpecError, TrainSpec, TwinSpec

FRAMEWORKS = ("torch", "jax", "flax", "torch_xla", "torchax")


class TwinError(SpecError):
    """A twin that cannot be loaded or built; one line naming the reference and what is wrong."""


@dataclass(frozen=True)
class Twin:
    torch: str  # factory of the torch.nn.Module
    nnx: str  # factory of the nnx.Module
    task: Literal["lm", "classification"] = "lm"
    hparams: Mapping = field(default_factory=dict)  # what both factories take; --set model.<name>=... reaches them
    io: Mapping = field(default_factory=dict)  # role -> hyperparameter name (see TwinSpec), when names differ
    # torch module (suffix) -> NNX modules it packs, split along torch's output rows in this order:
    # {"attn.qkv": ("attn.q", "attn.k", "attn.v")}
    packed: Mapping = field(default_factory=dict)
    rename: Mapping = field(default_factory=dict)  # regex over torch parameter names -> NNX name (re.sub)
    # regex over canonical (NNX) parameter names -> partition spec in the NNX layout, for mesh.tensor > 1:
    # (("attn\\.(q|k|v)\\.kernel", (None, "tensor")), ...); the first that matches wins
    partition_rules: tuple = ()
    nnx_dtype_arg: str | None = None  # the NNX factory's keyword for the compute dtype; None: float32 only
    # Hugging Face checkpoints it loads (common/hf.py): {"model_type": "llama", "prefix": "model.",
    # "config": {HF config key (dotted for nested): hyperparameter}}; empty: none
    hf: Mapping = field(default_factory=dict)
    init: Literal["torch", "canonical"] = "torch"  # whose initialisation both sides start from
    train: TrainSpec = field(default_factory=TrainSpec)
    data: DataSpec | None = None  # None: synthetic data of the task
    base_dir: str = ""  # set by load_twin: relative factory paths resolve against it


GPT_PACKED = {"attn.qkv": ("attn.q", "attn.k", "attn.v")}  # nanoGPT's packed projection (torch_impl.models)

BUILTIN: dict[str, Twin] = {
    family: Twin(torch=f"torch_impl.models:{family}", nnx=f"jax_impl.models:{family}",
                 task="lm" if family == "gpt" else "classification", packed=GPT_PACKED if family == "gpt" else {},
                 nnx_dtype_arg="compute_dtype", init="canonical", hf={"model_type": "gpt2"} if family == "gpt" else {})
    for family in ("mlp", "cnn", "gpt")
}


def hparams_of(model: ModelSpec) -> dict:
    """The keyword arguments of the model's factories."""
    if isinstance(model, TwinSpec):
        return {k: tuple(v) if isinstance(v, list) else v for k, v in model.hparams.items()}
    return {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name != "family"}


def twin_of(model: ModelSpec) -> Twin:
    return load_twin(model.twin) if isinstance(model, TwinSpec) else BUILTIN[model.family]


def _split_ref(ref: str, what: str) -> tuple[str, str]:
    target, sep, name = ref.rpartition(":")
    if not sep or not target or not name:
        raise TwinError(f"{what} {ref!r} must look like path/to/file.py:name or package.module:name")
    return target, name


def _import_file(path: Path):
    key = "_xla_twins_user_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))  # so the file can import its siblings
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module


def resolve(ref: str, base_dir: str = "", what: str = "factory"):
    """The object an import string names: `path/to/file.py:name` or `package.module:name[.attr]`."""
    target, name = _split_ref(ref, what)
    try:
        if target.endswith(".py") or "/" in target:
            path = Path(base_dir, target) if base_dir and not Path(target).is_absolute() else Path(target)
            if not path.is_file():
                raise TwinError(f"{what} {ref!r}: file {path} does not exist")
            if path.suffix != ".py":
                raise TwinError(f"{what} {ref!r}: {path} is not a Python file (.py)")
            module = _import_file(path.resolve())
        else:
            module = importlib.import_module(target)
    except TwinError:
        raise
    except ImportError as e:
        raise TwinError(f"{what} {ref!r}: cannot import {target}: {e}") from None
    except Exception as e:  # the user's module raised while it was imported
        raise TwinError(f"{what} {ref!r}: importing {target} raised {type(e).__name__}: {e}") from None
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise TwinError(f"{what} {ref!r}: {target} has no {name!r}")
        obj = getattr(obj, part)
    return obj


def load_twin(ref: str, *, frameworks_allowed: bool = True) -> Twin:
    """The Twin a `--twin FILE_OR_MODULE:NAME` reference names. `compare` loads it with
    frameworks_allowed=False: a twin file that imports torch or jax is refused (compare never imports one)."""
    before = set(sys.modules)
    twin = resolve(ref, what="twin")
    if not isinstance(twin, Twin):
        raise TwinError(f"twin {ref!r} is a {type(twin).__name__}, not a common.twin.Twin")
    loaded = sorted({m.split(".")[0] for m in set(sys.modules) - before} & set(FRAMEWORKS))
    if loaded and not frameworks_allowed:
        raise TwinError(f"twin {ref!r}: loading it imported {', '.join(loaded)}; keep framework code in the factory "
                        "modules, which only the backends import")
    target, _ = _split_ref(ref, "twin")
    base = str(Path(target).resolve().parent) if target.endswith(".py") else ""
    return dataclasses.replace(twin, base_dir=base)


def canonical_ref(ref: str) -> str:
    """A file reference made absolute, so backends started elsewhere find it."""
    target, name = _split_ref(ref, "twin")
    return f"{Path(target).resolve()}:{name}" if target.endswith(".py") else ref


def twin_run_spec(ref: str) -> RunSpec:
    """The run spec a `--twin` starts from: the twin's hyperparameters, train settings and data (before
    `--set` overrides; the canonical parameter tree is filled in by compare's prepare step)."""
    twin = load_twin(ref, frameworks_allowed=False)
    _, name = _split_ref(ref, "twin")
    default_data = DataSpec(dataset="synthetic-tokens" if twin.task == "lm" else "synthetic-classification")
    model = TwinSpec(twin=canonical_ref(ref), task=twin.task, hparams=dict(twin.hparams), io=dict(twin.io))
    return RunSpec(model=model, train=twin.train, mesh=MeshSpec(), data=twin.data or default_data, name=name)

"""A twin: one model written once in torch.nn and once in Flax NNX, and how the toolkit runs both.

Numpy only. `compare` reads a twin definition from a subprocess that imports the twin file (bounded
by --timeout; it imports no framework either, and compare never runs a user's code in its own
process); each backend resolves the factories in its own process. A user's twin file holds only this
definition (its factories live in modules that import torch or flax):

    # my_twin.py
    from common.twin import Twin
    my_model = Twin(torch="torch_model.py:Net", nnx="nnx_model.py:Net", task="classification",
                    hparams={"input_shape": 784, "hidden": 256, "num_classes": 10})

Factories are import strings, `"package.module:callable"` or `"path/to/file.py:callable"` (relative
to the twin's file). The torch factory is called as `factory(**hparams)`, the NNX one as
`factory(**hparams, rngs=nnx.Rngs(seed))` (plus `nnx_dtype_arg=<compute dtype>` when the twin names
one). The built-in models (mlp, cnn, gpt) are twins of exactly this kind (`BUILTIN`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from common.files.fsutil import require_regular_file
from common.procs import kill_group, start_group, toolkit_env
from common.spec import (
    TASK_DATASETS,
    DataSpec,
    MeshSpec,
    ModelSpec,
    RunSpec,
    SpecError,
    TrainSpec,
    TwinSpec,
)
from common.twin.fields import TwinError, check_fields, plain, unplain

FRAMEWORKS = ("torch", "jax", "flax", "torch_xla", "torchax")
# compare's --timeout default: loading a twin file that hangs is bounded even without one
LOAD_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Twin:
    torch: str  # factory of the torch.nn.Module
    nnx: str  # factory of the nnx.Module
    # what the model learns and is fed (common/spec TASKS): next tokens (lm), classes, a
    # regression target, or the twin's own batches and loss (custom, common/data/batches.py)
    task: Literal["lm", "classification", "regression", "custom"] = "lm"
    # the loss each side trains on, when not the task's own (cross-entropy of lm and classification,
    # mean squared error of regression): {"torch": "losses.py:huber", "nnx": "nnx_losses.py:huber"},
    # each called as loss(outputs, batch) -> scalar with the forward's whole output and batch =
    # {"inputs": ..., "targets": ...} (task custom: every array of the batch by its own name);
    # torch_xla and torchax run the torch one; "model": the
    # forward's output holds its own loss (a Hugging Face model given `labels`: its `loss`); empty:
    # the task's
    loss: Mapping | str = field(default_factory=dict)
    # task "custom" (common/data/batches.py): the batch keys only the loss reads (every other key is
    # a keyword of the forward)
    loss_keys: tuple = ()
    # task "custom": integer keys' declared ranges {key: (low, high)}, high excluded, a bound an int
    # or the name of a hyperparameter
    ranges: Mapping = field(default_factory=dict)
    # what both factories take; --set model.<name>=... reaches them
    hparams: Mapping = field(default_factory=dict)
    # role -> hyperparameter name (see TwinSpec), when names differ
    io: Mapping = field(default_factory=dict)
    # torch module (suffix) -> NNX modules it packs, split along torch's output rows in this order:
    # {"attn.qkv": ("attn.q", "attn.k", "attn.v")}
    packed: Mapping = field(default_factory=dict)
    # regex over torch parameter names -> NNX name (re.sub)
    rename: Mapping = field(default_factory=dict)
    # regex over canonical (NNX) parameter names -> the layout of their torch tensors
    # (common/spec/layouts.py), where no rule derives it: a named one ("conv_transpose") or a
    # rearrangement ("(h d) e -> h e d")
    layouts: Mapping = field(default_factory=dict)
    # regex over canonical (NNX) parameter names -> partition spec in the NNX layout, for
    # mesh.tensor > 1: (("attn\\.(q|k|v)\\.kernel", (None, "tensor")),
    # ...); the first that matches wins
    partition_rules: tuple = ()
    # the NNX factory's keyword for the compute dtype; None: float32 only
    nnx_dtype_arg: str | None = None
    # the NNX factory's keyword for the run's device mesh (a jax.sharding.Mesh over the axes data,
    # fsdp and tensor), for a port with `jax.shard_map` regions; None: the factory takes none
    nnx_mesh_arg: str | None = None
    # the torch factory's keyword for the run's torch.distributed DeviceMesh (the same axes and
    # sizes, over the processes of compare --processes N, one rank per device: Megatron's
    # numbering), for a per-rank torch side of a twin with nnx_mesh_arg; it gets None when every
    # rank runs on one process. None: the factory takes none
    torch_mesh_arg: str | None = None
    # the mesh the twin runs on unless --mesh says otherwise, e.g. {"tensor": 4} (fake CPU devices
    # are made to match on the CPU); empty: one device
    mesh: Mapping = field(default_factory=dict)
    # the transpose the NNX side's inputs take before its forward, e.g. (0, 2, 3, 1): NCHW images
    # fed to an NHWC port; empty: both sides take the batch as the task makes it
    # (docs/reference/what-each-side-is-fed.md)
    nnx_input_axes: tuple | Mapping = ()  # task custom: {batch key: axes} (the loss's keys too)
    # the transpose that brings the NNX side's forward output to the torch side's layout, e.g. (0,
    # 3, 1, 2): an NHWC port of a model that returns NCHW images; empty: both return one layout
    nnx_output_axes: tuple = ()
    # which of the forward's outputs is the logits, on both sides: a key or attribute ("logits") or
    # a position (0); None: the output itself, its `logits`, or its first element
    # (common/twin/outputs.py)
    logits: str | int | None = None
    # constant keywords each forward is called with besides the batch's arrays, both sides'
    # ({"return_loss": True}: transformers' CLIPModel then computes its own loss, for loss="model")
    # or each side's ({"torch": {...}, "nnx": {...}}): numbers, strings, booleans or None
    forward_kwargs: Mapping = field(default_factory=dict)
    # Hugging Face checkpoints it loads (common/twin/hf.py): {"model_type": "llama", "prefix":
    # "model.", "config": {HF config key (dotted for nested): hyperparameter}}; empty: none
    hf: Mapping = field(default_factory=dict)
    # each side's decode path, for `compare --generate N` (common/generation.py): {"nnx":
    # "file.py:decode"} called as decode(model, tokens, positions, mask, cache) -> (logits, cache),
    # cache None for the prefill; "torch" the same for a torch model, which a Hugging Face model
    # needs not name (its own cache: DynamicCache); empty: no decode path
    decode: Mapping = field(default_factory=dict)
    # the hyperparameter that picks the NNX side's kernels (a Pallas kernel where the torch side
    # calls its reference op): its value in hparams is the reference ("reference"), both sides'
    # default; a side run with another (--jax-set model.kernel=pallas) is judged by that kernel's
    # noise floor besides its parity (compare/judge/kernels.py); None: no kernel switch
    kernel_arg: str | None = None
    init: Literal["torch", "canonical"] = "torch"  # whose initialisation both sides start from
    train: TrainSpec = field(default_factory=TrainSpec)
    data: DataSpec | None = None  # None: synthetic data of the task
    base_dir: str = ""  # set by load_twin: relative factory paths resolve against it


def forward_kwargs_of(twin: Twin, side: str) -> dict:
    """The constant keywords `side`'s forward ("torch" or "nnx") is called with
    (Twin.forward_kwargs)."""
    given = dict(twin.forward_kwargs)
    per_side = (
        bool(given)
        and set(given) <= {"torch", "nnx"}
        and all(isinstance(v, Mapping) for v in given.values())
    )
    return dict(given.get(side, {})) if per_side else given


# nanoGPT's packed projection (torch_impl.models)
GPT_PACKED = {"attn.qkv": ("attn.q", "attn.k", "attn.v")}

BUILTIN: dict[str, Twin] = {
    family: Twin(
        torch=f"torch_impl.models:{family}",
        nnx=f"jax_impl.models:{family}",
        task="lm" if family == "gpt" else "classification",
        packed=GPT_PACKED if family == "gpt" else {},
        nnx_dtype_arg="compute_dtype",
        init="canonical",
        hf={"model_type": "gpt2"} if family == "gpt" else {},
    )
    for family in ("mlp", "cnn", "gpt")
}


def hparams_of(model: ModelSpec) -> dict:
    """The keyword arguments of the model's factories."""
    if isinstance(model, TwinSpec):
        return {k: tuple(v) if isinstance(v, list) else v for k, v in model.hparams.items()}
    return {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name != "family"}


def no_bfloat16_refusal(ref: str) -> TwinError:
    """A twin whose NNX factory takes no compute dtype, run in bfloat16."""
    return TwinError(
        f"twin {ref} names no nnx_dtype_arg, so its NNX side cannot compute in bfloat16; add one "
        "to the Twin or run float32"
    )


def factory_error(
    what: str, ref: str, e: Exception, keywords, factory=None, fields=None
) -> TwinError:
    """A factory that raised, in one line; one that does not take the keywords it is called with (a
    model class given as its own factory, say) is told which they are and what to give instead, and
    one that requires a keyword nobody gives (its signature read, not its error) is told where the
    toolkit gives such a keyword from."""
    message = f"{what} {ref} raised {type(e).__name__}: {e}"
    missing = _required_not_given(factory, keywords)
    taken = _parameters(factory)
    unknown = [(k, f) for k, f in (fields or {}).items() if taken is not None and k not in taken]
    if unknown:  # `fields`: {keyword: the twin field naming it}
        keyword, field_name = unknown[0]
        message += (
            f" (it takes no keyword {keyword!r}, which the twin's {field_name} names: name the "
            "factory's own keyword there)"
        )
    elif missing:
        side = "nnx" if what.startswith("NNX") else "torch"
        dtype = ", nnx_dtype_arg for its compute dtype" if side == "nnx" else ""
        message += (
            f" (it requires {', '.join(missing)}, which the twin does not give: a hyperparameter "
            f"in hparams, or the twin's {side}_mesh_arg={missing[0]!r} for the run's device "
            f"mesh{dtype})"
        )
    elif isinstance(e, TypeError) and (
        "keyword argument" in str(e) or "positional argument" in str(e)
    ):
        message += (
            f" (it is called with the keywords {', '.join(sorted(keywords))}: give a function "
            "that takes "
            "them and builds the model)"
        )
    return TwinError(message)


def _signature(factory) -> list | None:
    """The factory's parameters (a class's __init__'s: a metaclass's __call__ hides them, NNX's);
    None where Python cannot read them or it takes any keyword (**kwargs)."""
    try:
        if inspect.isclass(factory):
            parameters = list(inspect.signature(factory.__init__).parameters.values())[1:]
        else:
            parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):  # no factory, or one without a signature Python can read
        return None
    return None if any(p.kind == p.VAR_KEYWORD for p in parameters) else parameters


def _parameters(factory) -> set[str] | None:
    """The keywords the factory takes; None: any, or unknown."""
    parameters = _signature(factory)
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return None if parameters is None else {p.name for p in parameters if p.kind in keyword}


def _required_not_given(factory, keywords) -> list[str]:
    """The factory's parameters without a default that `keywords` do not give."""
    return [
        p.name
        for p in _signature(factory) or ()
        if p.default is p.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in keywords
    ]


def twin_of(model: ModelSpec) -> Twin:
    """The model's Twin: a built-in one, the one compare loaded in its own subprocess (never the
    user's file imported again in compare's process), or the file imported here (a backend)."""
    if not isinstance(model, TwinSpec):
        return BUILTIN[model.family]
    return _LOADED.get(_load_key(model.twin)) or load_twin(model.twin)


def _split_ref(ref: str, what: str) -> tuple[str, str]:
    target, sep, name = ref.rpartition(":")
    if not sep or not target or not name:
        raise TwinError(
            f"{what} {ref!r} must look like path/to/file.py:name or package.module:name"
        )
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
            path = (
                Path(base_dir, target)
                if base_dir and not Path(target).is_absolute()
                else Path(target)
            )
            if not path.exists():
                raise TwinError(f"{what} {ref!r}: file {path} does not exist")
            require_regular_file(path, f"{what} {ref!r}:", TwinError)
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
        raise TwinError(
            f"{what} {ref!r}: importing {target} raised {type(e).__name__}: {e}"
        ) from None
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise TwinError(f"{what} {ref!r}: {target} has no {name!r}")
        obj = getattr(obj, part)
    return obj


def user_loss(twin: Twin, side: str):
    """The twin's own loss function of `side` (torch or nnx), imported in the backend's process; of
    a twin whose forward returns its own loss, the function that reads it."""
    if twin.loss == "model":
        from common.twin.outputs import own_loss

        return lambda outputs, batch: own_loss(outputs)
    loss = resolve(twin.loss[side], twin.base_dir, what=f"loss[{side!r}]")
    if not callable(loss):
        raise TwinError(
            f"loss[{side!r}] {twin.loss[side]!r} is a {type(loss).__name__}, not a function"
        )
    return loss


def twin_words(model_spec) -> str:
    """How a message names the model: "twin FILE:NAME", or "the built-in gpt model"."""
    ref = getattr(model_spec, "twin", None)
    return f"twin {ref}" if ref else f"the built-in {model_spec.family} model"


def user_decode(twin: Twin, side: str):
    """The twin's own decode function of `side` (torch or nnx, Twin.decode), imported in the
    backend's process; None where it names none."""
    if side not in twin.decode:
        return None
    decode = resolve(twin.decode[side], twin.base_dir, what=f"decode[{side!r}]")
    if not callable(decode):
        raise TwinError(
            f"decode[{side!r}] {twin.decode[side]!r} is a {type(decode).__name__}, not a function"
        )
    return decode


def load_twin(ref: str, *, frameworks_allowed: bool = True, timeout_s: float | None = None) -> Twin:
    """The Twin a `--twin FILE_OR_MODULE:NAME` reference names, its fields checked (`check_fields`).

    A backend (frameworks_allowed=True) imports the twin file itself. `compare`
    (frameworks_allowed=False) never runs a user's code in its own process: the file is imported in
    a subprocess of its own, bounded by `timeout_s` and killed with its process group on every exit,
    which answers with the twin's fields as plain data; a twin file that imports torch or jax is
    refused there, and one that exits, raises or hangs while it is imported is one line (a
    TwinError)."""
    if not frameworks_allowed:
        return _load_isolated(ref, LOAD_TIMEOUT_S if timeout_s is None else timeout_s)
    return _load_here(ref, frameworks_allowed=True)


def _load_here(ref: str, *, frameworks_allowed: bool) -> Twin:
    before = set(sys.modules)
    twin = resolve(ref, what="twin")
    if not isinstance(twin, Twin):
        raise TwinError(f"twin {ref!r} is a {type(twin).__name__}, not a common.twin.Twin")
    loaded = sorted({m.split(".")[0] for m in set(sys.modules) - before} & set(FRAMEWORKS))
    if loaded and not frameworks_allowed:
        raise TwinError(
            f"twin {ref!r}: loading it imported {', '.join(loaded)}; keep framework code in the "
            "factory "
            "modules, which only the backends import"
        )
    check_fields(twin, ref)
    target, _ = _split_ref(ref, "twin")
    base = str(Path(target).resolve().parent) if target.endswith(".py") else ""
    return dataclasses.replace(twin, base_dir=base)


# ---- compare's side: the twin file imported in a subprocess of its own
# -----------------------------------

FIELDS_ANSWER = "xla-twins-twin "  # the loading process's one answer line on its stdout
# one load per twin file version in a process (compare reads the spec twice)
_LOADED: dict[tuple, Twin] = {}


def _answer(ref: str, parent_fd: int) -> None:
    """The loading process (`python -c ...`, started by _load_isolated): import the twin, answer its
    fields (or the one-line error) on stdout, to which nothing else is written. It takes its process
    group down when compare goes (the pipe `parent_fd` reaches end of file), whatever the twin file
    is doing."""
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the twin file's own prints go to stderr

    def watch_parent():
        while os.read(parent_fd, 1):
            pass
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch_parent, daemon=True).start()
    try:
        twin = _load_here(ref, frameworks_allowed=False)
        fields = {f.name: getattr(twin, f.name) for f in dataclasses.fields(Twin)}
        fields["train"] = dataclasses.asdict(twin.train)
        fields["data"] = dataclasses.asdict(twin.data) if twin.data else None
        reply = {"twin": plain(fields, "twin", ref)}
    except SpecError as e:
        reply = {"error": str(e)}
    except Exception as e:  # a twin declaration so odd that a check itself tripped over it
        reply = {
            "error": f"twin {ref!r}: its declaration could not be read: {type(e).__name__}: {e}"
        }
    answer.write(FIELDS_ANSWER + json.dumps(reply) + "\n")
    answer.flush()


def _from_answer(reply: dict) -> Twin:
    fields = unplain(reply)
    fields["train"] = TrainSpec(**fields["train"])
    fields["data"] = DataSpec(**fields["data"]) if fields["data"] else None
    return Twin(**fields)


def _load_key(ref: str) -> tuple:
    """One load per twin file version: its reference and the file's modification time."""
    target, _ = _split_ref(ref, "twin")
    path = Path(target)
    stamp = path.stat().st_mtime_ns if target.endswith(".py") and path.is_file() else None
    return (canonical_ref(ref), stamp)


def _load_isolated(ref: str, timeout_s: float) -> Twin:
    target, _ = _split_ref(ref, "twin")
    key = _load_key(ref)
    if key in _LOADED:
        return _LOADED[key]
    env = toolkit_env()
    code = "import sys; from common.twin import _answer; _answer(sys.argv[1], int(sys.argv[2]))"
    # Its output goes to unnamed files, not pipes: a process the twin file starts would hold a pipe
    # open after the loader exits. compare holds write_end: when compare dies, the loader sees end
    # of file.
    read_end, write_end = os.pipe()
    with (
        tempfile.TemporaryFile("w+", errors="replace") as out,
        tempfile.TemporaryFile("w+", errors="replace") as err,
    ):
        try:
            try:
                proc = start_group(
                    [sys.executable, "-c", code, ref, str(read_end)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env=env,
                    pass_fds=(read_end,),
                )
            except OSError as e:
                raise TwinError(
                    f"twin {ref!r}: cannot start {sys.executable} to load it: {e.strerror or e}"
                ) from None
            finally:
                os.close(read_end)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise TwinError(
                    f"twin {ref!r}: importing {target} did not load within --timeout "
                    f"{timeout_s:g} s "
                    "(killed with its process group); a twin file should only define the Twin"
                ) from None
            # every exit (an answer, a timeout, Ctrl-C / SIGTERM in
            # compare): nothing it started is left
            finally:
                kill_group(proc)  # its own session: the process and whatever it started
        finally:
            os.close(write_end)
        stdout, stderr = (f.seek(0) or f.read() for f in (out, err))
    replies = [ln for ln in stdout.splitlines() if ln.startswith(FIELDS_ANSWER)]
    if not replies:
        said = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
        said = f"; it printed: {said[-1][:200]}" if said else ""
        if proc.returncode < 0:
            raise TwinError(
                f"twin {ref!r}: importing {target} was killed by "
                f"{signal.Signals(-proc.returncode).name}{said}"
            )
        raise TwinError(
            f"twin {ref!r}: importing {target} exited with code {proc.returncode} before defining "
            "the "
            f"twin (sys.exit at import?){said}"
        )
    reply = json.loads(replies[-1].removeprefix(FIELDS_ANSWER))
    if "error" in reply:
        raise TwinError(reply["error"])
    _LOADED[key] = twin = _from_answer(reply["twin"])
    return twin


def canonical_ref(ref: str) -> str:
    """A file reference made absolute, so backends started elsewhere find it."""
    target, name = _split_ref(ref, "twin")
    return f"{Path(target).resolve()}:{name}" if target.endswith(".py") else ref


def twin_run_spec(ref: str, timeout_s: float | None = None) -> RunSpec:
    """The run spec a `--twin` starts from: the twin's hyperparameters, train settings and data
    (before `--set` overrides; the canonical parameter tree is filled in by compare's prepare step).
    The twin file is loaded in a subprocess bounded by `timeout_s` (compare's --timeout)."""
    twin = load_twin(ref, frameworks_allowed=False, timeout_s=timeout_s)
    _, name = _split_ref(ref, "twin")
    default_data = DataSpec(dataset=TASK_DATASETS[twin.task][0])
    model = TwinSpec(
        twin=canonical_ref(ref), task=twin.task, hparams=dict(twin.hparams), io=dict(twin.io)
    )
    return RunSpec(
        model=model,
        train=twin.train,
        mesh=MeshSpec(**twin.mesh),
        data=twin.data or default_data,
        name=name,
    )

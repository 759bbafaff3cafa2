"""A twin's declarations, checked when it is loaded, before any process builds a model
(`check_fields`): one line naming the field and the fix. And the plain data a twin crosses processes
as (`plain`): compare reads a twin from the subprocess that imported it, never importing the user's
file itself."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from common.spec import AXES, TASKS, DataSpec, SpecError, TrainSpec
from common.spec.layouts import NAMED, LayoutError, check_layout


class TwinError(SpecError):
    """A twin that cannot be loaded or built; one line naming the reference and what is wrong."""


def plain(value, where: str, ref: str):
    """`value` as JSON, tuples tagged (a twin crosses from its loading process as plain data);
    anything else is refused, naming the field."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        items = [plain(v, f"{where}[{i}]", ref) for i, v in enumerate(value)]
        return {"__tuple__": items} if isinstance(value, tuple) else items
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: plain(v, f"{where}[{k!r}]", ref) for k, v in value.items()}
    what = (
        "a mapping with keys that are not strings"
        if isinstance(value, Mapping)
        else f"a {type(value).__name__}"
    )
    raise TwinError(
        f"twin {ref!r}: {where} is {what}; a twin's fields hold plain data (numbers, strings, "
        "tuples, "
        "lists, dicts with string keys), which compare reads without importing your code"
    )


def unplain(value):
    if isinstance(value, list):
        return [unplain(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"__tuple__"}:
            return tuple(unplain(v) for v in value["__tuple__"])
        return {k: unplain(v) for k, v in value.items()}
    return value


def _regex(pattern, where: str, ref: str, fix: str) -> re.Pattern:
    if not isinstance(pattern, str):
        raise TwinError(
            f"twin {ref!r}: {where} {pattern!r} is a {type(pattern).__name__}, not a regular "
            "expression "
            f"string; {fix}"
        )
    try:
        return re.compile(pattern)
    except re.error as e:
        raise TwinError(
            f"twin {ref!r}: {where} {pattern!r} is not a valid regular expression ({e}); {fix}"
        ) from None


def _check_mapping(twin, name: str, ref: str, example: str) -> Mapping:
    value = getattr(twin, name)
    if not isinstance(value, Mapping):
        raise TwinError(
            f"twin {ref!r}: {name} is a {type(value).__name__}, not a dict; write it as "
            f"{name}={example}"
        )
    return value


def _check_forward_kwargs(twin, ref: str) -> None:
    given = _check_mapping(twin, "forward_kwargs", ref, '{"return_loss": True}')
    sides = set(given) <= {"torch", "nnx"} and all(isinstance(v, Mapping) for v in given.values())
    for side, kwargs in given.items() if given and sides else [("", given)]:
        for key, value in kwargs.items():
            where = f"forward_kwargs{f'[{side!r}]' if side else ''}[{key!r}]"
            if not (isinstance(key, str) and key.isidentifier()):
                raise TwinError(
                    f"twin {ref!r}: {where}: {key!r} is not a keyword the forward can take"
                )
            if not (value is None or isinstance(value, (bool, int, float, str))):
                raise TwinError(
                    f"twin {ref!r}: {where}={value!r} must be a number, string, boolean or None (a "
                    "constant every forward is called with; arrays come from the batch)"
                )


def _check_rename(twin, ref: str) -> None:
    fix = (
        r"write rename as {regex over torch parameter names: replacement (re.sub)}, e.g. "
        r"{r'\.self_attn\.': '.attn.'}"
    )
    for pattern, replacement in _check_mapping(
        twin, "rename", ref, r"{r'\.self_attn\.': '.attn.'}"
    ).items():
        compiled = _regex(pattern, "rename", ref, fix)
        if not isinstance(replacement, str):
            raise TwinError(
                f"twin {ref!r}: rename {pattern!r} -> {replacement!r}: the replacement is a "
                f"{type(replacement).__name__}, not a string; {fix}"
            )
        try:
            compiled.sub(replacement, "")
        except re.error as e:
            raise TwinError(
                f"twin {ref!r}: rename {pattern!r} -> {replacement!r}: the replacement is not "
                "valid "
                f"({e}); {fix}"
            ) from None


def _check_packed(twin, ref: str) -> None:
    example = "{'attn.qkv': ('attn.q', 'attn.k', 'attn.v')}"
    for key, parts in _check_mapping(twin, "packed", ref, example).items():
        if not (
            isinstance(key, str)
            and key
            and isinstance(parts, (tuple, list))
            and len(parts) >= 2
            and all(isinstance(p, str) and p for p in parts)
        ):
            raise TwinError(
                f"twin {ref!r}: packed {key!r}: {parts!r} is malformed; packed maps a module to "
                "the "
                "tuple of the two or more modules of the other side it packs, in row order (a "
                "torch "
                f"module to NNX modules, or an NNX module to torch modules), e.g. packed={example}"
            )


def _check_layouts(twin, ref: str) -> None:
    example = "{r'attn\\.q\\.kernel$': '(h d) e -> h e d'}"
    fix = (
        f"write layouts as {{regex over NNX parameter names: layout}}, a layout being one of "
        f"{', '.join(NAMED)} "
        f"or a rearrangement from torch's axes to the NNX ones, e.g. {example}"
    )
    for pattern, layout in _check_mapping(twin, "layouts", ref, example).items():
        _regex(pattern, "layouts", ref, fix)
        if not isinstance(layout, str):
            raise TwinError(
                f"twin {ref!r}: layouts {pattern!r} -> {layout!r} is not a string; {fix}"
            )
        try:
            check_layout(layout)
        except LayoutError as e:
            raise TwinError(f"twin {ref!r}: {e}; {fix}") from None


def _check_partition_rules(twin, ref: str) -> None:
    example = r"((r'attn\.q\.kernel$', (None, 'tensor')), ...)"
    fix = (
        "give partition_rules as a tuple of (regex over NNX parameter names, partition spec) "
        f"pairs, e.g. {example}"
    )
    rules = twin.partition_rules
    if isinstance(rules, (str, Mapping)) or not isinstance(rules, (tuple, list)):
        raise TwinError(f"twin {ref!r}: partition_rules is a {type(rules).__name__}; {fix}")
    for i, rule in enumerate(rules):
        if not (
            isinstance(rule, (tuple, list))
            and len(rule) == 2
            and isinstance(rule[1], (tuple, list))
        ):
            raise TwinError(
                f"twin {ref!r}: partition_rules[{i}] = {rule!r} is not a (regex, spec) pair; {fix}"
            )
        pattern, spec = rule
        _regex(pattern, f"partition_rules[{i}]", ref, fix)
        for axis in spec:
            if axis is not None and axis not in AXES:
                raise TwinError(
                    f"twin {ref!r}: partition_rules[{i}] ({pattern!r}) names {axis!r}, which is "
                    "not a mesh "
                    f"axis; each entry of a spec is None or one of {', '.join(AXES)} (one per "
                    "dimension)"
                )


def _check_hf(twin, ref: str) -> None:
    hf = _check_mapping(
        twin, "hf", ref, "{'model_type': 'llama', 'prefix': 'model.', 'config': {...}}"
    )
    if not hf:
        return
    unknown = sorted(set(hf) - {"model_type", "prefix", "config"})
    if (
        unknown
        or not isinstance(hf.get("model_type"), str)
        or not isinstance(hf.get("prefix", ""), str)
    ):
        raise TwinError(
            f"twin {ref!r}: hf={dict(hf)!r} is malformed; it holds model_type (the Hugging Face "
            "config's, e.g. 'llama'), optionally prefix (of the checkpoint's tensor names) and "
            "config "
            "({HF config key: hyperparameter})"
        )
    config = hf.get("config", {})
    if not isinstance(config, Mapping):
        raise TwinError(
            f"twin {ref!r}: hf['config'] is a {type(config).__name__}; it maps each Hugging Face "
            "config "
            "key to the hyperparameter it must equal, e.g. {'hidden_size': 'd_model'}"
        )
    for key, hparam in config.items():
        if hparam not in twin.hparams:
            raise TwinError(
                f"twin {ref!r}: hf['config'] maps {key!r} to {hparam!r}, which is not one of its "
                f"hyperparameters ({', '.join(map(str, twin.hparams)) or 'none'}); name one of them"
            )


def _check_input_axes(twin, ref: str) -> None:
    axes = twin.nnx_input_axes
    if axes == () or axes is None:
        return
    if isinstance(axes, Mapping) and twin.task == "custom":  # per named input
        for key, one in axes.items():
            _check_input_axes(
                dataclasses.replace(twin, nnx_input_axes=one, task=""), f"{ref}: {key}"
            )
        return
    if not (
        isinstance(axes, (tuple, list))
        and all(isinstance(a, int) for a in axes)
        and sorted(axes) == list(range(len(axes)))
        and len(axes) >= 2
        and axes[0] == 0
    ):
        raise TwinError(
            f"twin {ref!r}: nnx_input_axes={axes!r} must be a permutation of the input's axes "
            "that keeps "
            "the batch axis first, e.g. (0, 2, 3, 1) to feed NCHW images to an NHWC port"
        )


LOSS_SIDES = ("torch", "nnx")


def _check_loss(twin, ref: str) -> None:
    if twin.task == "custom" and not twin.loss:
        raise TwinError(
            f"twin {ref!r}: task='custom' trains on the twin's own loss; give loss={{'torch': "
            "'file.py:loss', 'nnx': 'file.py:loss'}, or loss='model' when the forward returns its "
            "own"
        )
    if twin.loss == "model":
        return
    loss = _check_mapping(
        twin, "loss", ref, '{"torch": "file.py:loss", "nnx": "file.py:loss"} or "model"'
    )
    if not loss:
        return
    _check_side_functions(loss, "loss", ref, required=True)


def _check_side_functions(given: Mapping, field_name: str, ref: str, required: bool) -> None:
    """A field naming one function per side ({"torch": "file.py:name", "nnx": ...}): its keys the
    sides (both when `required`), each value a function's path."""
    missing = [side for side in LOSS_SIDES if side not in given] if required else []
    extra = [str(k) for k in given if k not in LOSS_SIDES]
    if missing or extra:
        raise TwinError(
            f"twin {ref!r}: {field_name} names one function per side, keys torch and nnx; "
            + (f"{' and '.join(missing)} missing" if missing else f"{', '.join(extra)} unknown")
        )
    for side, target in given.items():
        module, sep, name = target.rpartition(":") if isinstance(target, str) else ("", "", "")
        if not (sep and module and name):
            raise TwinError(
                f"twin {ref!r}: {field_name}[{side!r}]={target!r} must name the function as "
                "path/to/file.py:name or package.module:name"
            )


def _check_decode(twin, ref: str) -> None:
    decode = _check_mapping(twin, "decode", ref, '{"nnx": "file.py:decode"}')
    _check_side_functions(decode, "decode", ref, required=False)


def _check_custom(twin, ref: str) -> None:
    keys = twin.loss_keys
    if not isinstance(keys, (tuple, list)) or not all(isinstance(k, str) for k in keys):
        raise TwinError(
            f"twin {ref!r}: loss_keys={keys!r} must be a tuple of batch keys, e.g. ('noise',)"
        )
    for key, bounds in _check_mapping(
        twin, "ranges", ref, "{'input_ids': (0, 'vocab_size')}"
    ).items():
        if not (
            isinstance(bounds, (tuple, list))
            and len(bounds) == 2
            and all(
                isinstance(b, str)
                and b in twin.hparams
                or isinstance(b, int)
                and not isinstance(b, bool)
                for b in bounds
            )
        ):
            raise TwinError(
                f"twin {ref!r}: ranges[{key!r}]={bounds!r} must be (low, high), each an int or the "
                "name of a hyperparameter, e.g. (0, 'vocab_size')"
            )


def _check_mesh(twin, ref: str) -> None:
    mesh = _check_mapping(twin, "mesh", ref, '{"tensor": 4}')
    bad = [
        f"{k}={v!r}"
        for k, v in mesh.items()
        if k not in AXES or not isinstance(v, int) or isinstance(v, bool) or v < 1
    ]
    if bad:
        raise TwinError(
            f"twin {ref!r}: mesh {bad[0]}: the mesh maps axes of {', '.join(AXES)} to device "
            'counts (positive ints), e.g. mesh={"tensor": 4}'
        )
    for side in ("nnx", "torch"):
        arg = getattr(twin, f"{side}_mesh_arg")
        if arg is not None and not (isinstance(arg, str) and arg.isidentifier()):
            raise TwinError(
                f"twin {ref!r}: {side}_mesh_arg={arg!r} must be the name of the {side.upper()} "
                "factory's mesh keyword (e.g. 'mesh'), or None"
            )
    if twin.torch_mesh_arg is not None and twin.nnx_mesh_arg is None:
        raise TwinError(
            f"twin {ref!r}: torch_mesh_arg={twin.torch_mesh_arg!r} gives a per-rank torch side "
            "its ranks' mesh, for a twin whose NNX side takes the mesh too: set nnx_mesh_arg"
        )


def _check_kernel_arg(twin, ref: str) -> None:
    arg = twin.kernel_arg
    if arg is None:
        return
    if not isinstance(arg, str) or not isinstance(twin.hparams.get(arg), str):
        raise TwinError(
            f"twin {ref!r}: kernel_arg={arg!r} must name a hyperparameter whose value is the "
            "reference kernel both sides run by default, e.g. kernel_arg='kernel' with "
            "hparams={..., 'kernel': 'reference'}"
        )


def check_fields(twin, ref: str) -> None:
    """Every declaration of a twin that can be checked without building a model: one TwinError
    naming the field and the fix. (Those that need the models, a `packed` that matches no module, a
    model without parameters, a forward that returns more than one tensor, are checked when the
    sides describe themselves, still before anything trains.)"""
    for side in ("torch", "nnx"):
        factory = getattr(twin, side)
        target, sep, name = factory.rpartition(":") if isinstance(factory, str) else ("", "", "")
        if not (sep and target and name):
            raise TwinError(
                f"twin {ref!r}: {side}={factory!r} must name its factory as path/to/file.py:name "
                "or "
                "package.module:name"
            )
    if twin.task not in TASKS:
        raise TwinError(f"twin {ref!r}: task={twin.task!r} is not one of {', '.join(TASKS)}")
    _check_loss(twin, ref)
    if twin.init not in ("torch", "canonical"):
        raise TwinError(f"twin {ref!r}: init={twin.init!r} is not one of torch, canonical")
    for name in ("hparams", "io"):
        plain(_check_mapping(twin, name, ref, "{...}"), name, ref)
    bad_io = [f"{k}: {v!r}" for k, v in twin.io.items() if not isinstance(v, str)]
    if bad_io:
        raise TwinError(
            f"twin {ref!r}: io maps a data role to the name of a hyperparameter; {bad_io[0]} is "
            "not one"
        )
    dtype_arg = twin.nnx_dtype_arg
    if dtype_arg is not None and not (isinstance(dtype_arg, str) and dtype_arg.isidentifier()):
        raise TwinError(
            f"twin {ref!r}: nnx_dtype_arg={twin.nnx_dtype_arg!r} must be the name of the NNX "
            "factory's "
            "compute-dtype keyword (e.g. 'dtype'), or None"
        )
    _check_kernel_arg(twin, ref)
    _check_mesh(twin, ref)
    _check_input_axes(twin, ref)
    _check_input_axes(
        dataclasses.replace(twin, nnx_input_axes=twin.nnx_output_axes, task=""),
        f"{ref}: nnx_output_axes",
    )
    if (
        twin.logits is not None
        and not isinstance(twin.logits, (str, int))
        or isinstance(twin.logits, bool)
    ):
        raise TwinError(
            f"twin {ref!r}: logits={twin.logits!r} must name the forward's output that holds the "
            "logits: "
            "a key or attribute ('logits') or a position (0), or None"
        )
    if not isinstance(twin.train, TrainSpec) or not isinstance(twin.data, (DataSpec, type(None))):
        field_name, want = (
            ("train", "TrainSpec")
            if not isinstance(twin.train, TrainSpec)
            else ("data", "DataSpec")
        )
        raise TwinError(
            f"twin {ref!r}: {field_name} is a {type(getattr(twin, field_name)).__name__}; give a "
            f"common.spec.{want}(...)"
        )
    _check_rename(twin, ref)
    _check_packed(twin, ref)
    _check_layouts(twin, ref)
    _check_partition_rules(twin, ref)
    _check_hf(twin, ref)
    _check_custom(twin, ref)
    _check_decode(twin, ref)
    _check_forward_kwargs(twin, ref)
    for name in (
        "loss",
        "decode",
        "loss_keys",
        "ranges",
        "packed",
        "rename",
        "layouts",
        "partition_rules",
        "hf",
        "forward_kwargs",
    ):
        plain(getattr(twin, name), name, ref)

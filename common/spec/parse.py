"""Spec parsing: a TOML/JSON spec file or a run record's spec -> RunSpec, and `--set` overrides.

Values are coerced to each field's type with a one-line `SpecError` naming field, value and rule; a
user twin's hyperparameters (`model.<name>`) take the type of their default.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Literal

from common.spec import (
    MODEL_FAMILIES,
    DataSpec,
    MeshSpec,
    RunSpec,
    SpecError,
    TrainSpec,
    TwinSpec,
    _require,
)

SECTIONS = "model, train, mesh, data"


def _shape_of(value) -> str:
    """What a TOML/JSON value is, in words: 'a list', 'a string', ..."""
    return {
        dict: "a table",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)


def _table(raw: dict, section: str) -> dict:
    """A spec section: a table (a JSON object), or absent (its defaults)."""
    value = raw.get(section)
    if value is None:
        return {}
    _require(
        isinstance(value, dict),
        f"section {section} is {_shape_of(value)} ({_short(repr(value))}); it must be a "
        f'table of fields, e.g. [{section}] in TOML or "{section}": {{...}} in JSON',
    )
    return value


def _short(value, limit: int = 40) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_spec_from_dict(raw: dict, name: str = "custom") -> RunSpec:
    """Build from plain dicts (a parsed TOML/JSON file or a record's spec). Any shape of input gives
    a SpecError naming the field, never another exception."""
    _require(
        isinstance(raw, dict),
        f"a spec is a table with model/train/mesh/data sections, not {_shape_of(raw)}",
    )
    raw = dict(raw)
    model_raw = dict(_table(raw, "model"))
    family = model_raw.get("family")
    _require(
        isinstance(family, str) and family in MODEL_FAMILIES,
        f"model.family={family!r} is unknown; choose one of {', '.join(MODEL_FAMILIES)}",
    )
    model = (
        _twin_from_dict(model_raw)
        if family == "twin"
        else _build(MODEL_FAMILIES[family], model_raw, "model")
    )
    sections = {
        "model": model,
        "train": _build(TrainSpec, _table(raw, "train"), "train"),
        "mesh": _build(MeshSpec, _table(raw, "mesh"), "mesh"),
        "data": _build(DataSpec, _table(raw, "data"), "data"),
    }
    unknown = sorted(set(raw) - set(sections) - {"name"})
    if unknown:
        raise SpecError(f"unknown spec section {unknown[0]!r}; sections are {SECTIONS}")
    return RunSpec(name=str(raw.get("name", name)), **sections)


def _twin_from_dict(raw: dict) -> TwinSpec:
    fields = {f.name for f in dataclasses.fields(TwinSpec)}
    unknown = sorted(set(raw) - fields)
    _require(
        not unknown,
        f"unknown key model.{unknown[0] if unknown else ''}; a twin model has: {', '.join(fields)}",
    )
    for key in ("hparams", "io", "params"):
        _require(isinstance(raw.get(key, {}), dict), f"model.{key} must be a table")
    for key in ("twin", "task"):
        _require(
            isinstance(raw.get(key, ""), str),
            f"model.{key}={_short(raw.get(key))} must be a string",
        )
    for tensor, shape in raw.get("params", {}).items():
        _require(
            isinstance(shape, list)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape),
            f"model.params.{tensor}={_short(shape)} must be a shape: a list of sizes >= 0",
        )
    return TwinSpec(**raw)


def _build(cls: type, raw: dict, section: str):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in raw.items():
        _require(key in fields, f"unknown key {section}.{key}; {section} has: {', '.join(fields)}")
        kwargs[key] = _coerce(f"{section}.{key}", value, hints[key])
    return cls(**kwargs)


def _coerce(where: str, value, hint):
    """Convert a TOML/JSON value or a `--set` string to the field's type."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        _require(value in choices, f"{where}={value} is not one of {', '.join(map(str, choices))}")
        return value
    if origin is tuple:
        if isinstance(value, str):
            text = value.strip().strip("[]()")
            value = [v for v in (p.strip() for p in text.split(",")) if v]
        _require(
            isinstance(value, (list, tuple)),
            f"{where}={value} must be a list of integers, e.g. 128,64",
        )
        return tuple(_coerce(where, v, int) for v in value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        _require(text in ("true", "false", "1", "0"), f"{where}={value} must be true or false")
        return text in ("true", "1")
    if hint is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise SpecError(f"{where}={value} must be an integer")
        try:
            return int(value) if not isinstance(value, str) else int(value.strip())
        except (TypeError, ValueError, OverflowError):  # a list or a table; inf
            raise SpecError(f"{where}={_short(value)} must be an integer") from None
    if hint is float:
        _require(not isinstance(value, bool), f"{where}={value} must be a number")
        try:
            result = float(value)
        except (TypeError, ValueError):
            raise SpecError(f"{where}={value} must be a number") from None
        _require(math.isfinite(result), f"{where}={value} must be a finite number")
        return result
    if hint is str:
        _require(
            isinstance(value, (str, int, float)) and not isinstance(value, bool),
            f"{where}={_short(value)} must be a string",
        )
        return str(value)
    # a bug in this file, not in the input
    raise SpecError(f"{where}: unsupported field type {hint}")


def apply_overrides(spec: RunSpec, overrides: list[str]) -> RunSpec:
    """Apply `section.field=value` strings, each parsed to the field's type."""
    sections = {"model": spec.model, "train": spec.train, "mesh": spec.mesh, "data": spec.data}
    for item in overrides:
        key, sep, value = item.partition("=")
        section, dot, name = key.strip().partition(".")
        _require(
            bool(sep) and bool(dot) and bool(name),
            f"--set {item!r} must look like section.field=value (e.g. train.lr=3e-4)",
        )
        _require(
            section in sections,
            f"--set {key}: unknown section {section!r}; sections are model, train, mesh, data",
        )
        target = sections[section]
        if section == "model":
            sections["model"] = _set_model_field(target, name, key, value)
            continue
        names = [f.name for f in dataclasses.fields(target)]
        _require(
            name in names,
            f"--set {key}: unknown key {section}.{name}; {section} has: {', '.join(names)}",
        )
        hint = typing.get_type_hints(type(target))[name]
        sections[section] = dataclasses.replace(target, **{name: _coerce(key, value, hint)})
    return dataclasses.replace(spec, **sections)


def _set_model_field(model, name: str, key: str, value: str):
    # a hyperparameter of the user's factories, typed by its default
    if isinstance(model, TwinSpec):
        _require(
            name in model.hparams,
            f"--set {key}: twin {model.twin} has no hyperparameter {name!r}; "
            f"it has: {', '.join(model.hparams)}",
        )
        default = model.hparams[name]
        ints = isinstance(default, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in default
        )
        _require(
            ints or type(default) in (int, float, bool, str),
            f"--set {key}: hyperparameter {name!r} of twin {model.twin} is {_short(default)} "
            f"({_shape_of(default)}"
            "); --set reaches numbers, booleans, strings and lists of integers: change it in the "
            "twin's "
            "hparams instead",
        )
        hint = tuple[int, ...] if ints else type(default)
        return dataclasses.replace(
            model, hparams={**model.hparams, name: _coerce(key, value, hint)}
        )
    names = [f.name for f in dataclasses.fields(model)]
    _require(name in names, f"--set {key}: unknown key model.{name}; model has: {', '.join(names)}")
    _require(
        name != "family",
        "--set model.family cannot switch model families; pick a preset or spec file with --spec",
    )
    hint = typing.get_type_hints(type(model))[name]
    return dataclasses.replace(model, **{name: _coerce(key, value, hint)})

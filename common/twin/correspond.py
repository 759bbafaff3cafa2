"""Parameter correspondence between a torch model and its NNX twin, derived from the two trees.

The canonical tree is the NNX model's (its `nnx.state(model, nnx.Param)` paths and layouts). Each
torch parameter links to one canonical tensor, or to several when it packs them (nanoGPT's
`attn.qkv`). A link is found by name, after the twin's `rename` regexes, with module paths compared
case- and underscore-blind (and blind to the `layers.` level of an `nnx.Sequential`), and the
standard leaf and layout rules:

  torch leaf   NNX leaf     layout (torch -> canonical)
  weight       kernel       2-D: transpose (Linear (out, in) -> (in, out));
                            n-D: (O, I, *k) -> (*k, I, O)  (Conv OIHW -> HWIO)
  weight       embedding    same          (Embedding)
  weight       scale        same          (LayerNorm, RMSNorm)
  bias         bias         same
  <other>      <same name>  same, or transposed when the 2-D shapes are reversed

and a reshape where the NNX side splits head axes (nnx.MultiHeadAttention's LinearGeneral kernels
(E, H, D) and (H, D, E), biases (H, D)). nn.MultiheadAttention's own parameters link to
nnx.MultiHeadAttention's with no declaration: `in_proj_weight`/`in_proj_bias` pack query|key|value,
`out_proj` is `out`.

A torch ConvTranspose's weight (in, out, *k) takes its layout from the NNX module it meets (the
sides' module types, from their describe steps): `nnx.ConvTranspose` keeps it flipped
(`conv_transpose`), or, with `transpose_kernel=True`, as the convolution it is the gradient of
(`conv`); any other NNX module must declare it. A twin's `layouts` ({regex over NNX parameter names:
layout}) declares a layout no rule derives, a rearrangement of axes among them ("(h d) e -> h e d":
common/spec/layouts.py); a declaration that matches no NNX parameter is an error.

`packed` works both ways: a key naming a torch module maps it to the NNX modules it packs (split
along torch's dim 0); a key naming an NNX module (a port that fuses q/k/v, the usual JAX style) maps
it to the torch modules it packs, whose tensors stack along torch's dim 0 (the NNX kernel's output
columns).

Anything left unmatched on either side fails with one line naming such tensors (12 a side, and how
many more), each with its shape and closest candidate on the other side (common/twin/unmatched.py).
Conversions are numpy and exact (transposes, flips, reshapes, splits, concats).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping

import numpy as np

from common.spec import SpecError
from common.spec.layouts import (
    CONV,
    CONV_TRANSPOSE,
    SAME,
    TRANSPOSE,
    LayoutError,
    Rearrangement,
    check_layout,
    is_rearrangement,
)
from common.spec.layouts import torch_shape as torch_shape_of
from common.twin.links import Correspondence, Link, packed_axis
from common.twin.unmatched import SHAPE_DIFFERS, module_leaf, unmatched_message

LEAF_RULES = {"weight": ("kernel", "embedding", "scale", "weight"), "bias": ("bias",)}


class CorrespondenceError(SpecError):
    """The two parameter trees do not correspond; one line listing every unmatched tensor."""


# nn.MultiheadAttention's own parameters -> nnx.MultiHeadAttention's modules and leaf (no
# declaration needed)
QKV = ("query", "key", "value")
STOCK_LEAVES = {
    "in_proj_weight": (QKV, "kernel"),
    "in_proj_bias": (QKV, "bias"),
    "q_proj_weight": (("query",), "kernel"),
    "k_proj_weight": (("key",), "kernel"),
    "v_proj_weight": (("value",), "kernel"),
}
MODULE_ALIASES = {"out_proj": "out"}  # tried when the torch module's own name matches nothing


def _layout(leaf: str, torch_shape: tuple, canonical_shape: tuple) -> str:
    if leaf == "kernel":
        return TRANSPOSE if len(torch_shape) == 2 else CONV
    if (
        len(torch_shape) == 2
        and torch_shape != canonical_shape
        and torch_shape[::-1] == tuple(canonical_shape)
    ):
        return TRANSPOSE
    return SAME


def _flat_shapes(canonical_shape: tuple, torch_ndim: int) -> list[tuple]:
    """The shapes a canonical tensor may have before a reshape splits head axes, for a torch tensor
    of `torch_ndim` dimensions: itself; a LinearGeneral kernel (E, H, D) as (E, H*D) or (H, D, E) as
    (H*D, E); a bias (H, D) as (H*D,)."""
    n, size = len(canonical_shape), int(np.prod(canonical_shape))
    if n == torch_ndim:
        return [tuple(canonical_shape)]
    if torch_ndim == 1:
        return [(size,)]
    if torch_ndim == 2 and n >= 3:
        return [
            (canonical_shape[0], size // canonical_shape[0]),
            (size // canonical_shape[-1], canonical_shape[-1]),
        ]
    return []


_SEQUENCE_LEVEL = re.compile(r"(^|\.)layers\.(?=\d)")


def normalised_path(module: str) -> str:
    """A module path as matched: case- and underscore-blind, and without the `layers.` level that
    `nnx.Sequential` (and a `layers` list on either side) puts before an index, so torch's
    `downsample.0` meets NNX's `downsample.layers.0`."""
    previous = None
    while previous != module:
        previous, module = module, _SEQUENCE_LEVEL.sub(r"\1", module)
    return module.lower().replace("_", "")


def _fits(torch_shape: tuple, parts: list[tuple], axis: int = 0) -> bool:
    """The parts (in torch layout) make up the torch tensor: equal, or stacked along `axis`."""
    if len(parts) == 1:
        return parts[0] == torch_shape
    others = lambda shape: shape[:axis] + shape[axis + 1 :]  # noqa: E731
    return (
        all(others(p) == others(torch_shape) for p in parts)
        and sum(p[axis] for p in parts) == torch_shape[axis]
    )


def _packed_targets(module: str, packed: Mapping[str, tuple]) -> list[str] | None:
    for key, parts in packed.items():
        if module == key or module.endswith("." + key):
            prefix = module[: len(module) - len(key)]
            return [prefix + p for p in parts]
    return None


def renamed(name: str, rename: Mapping[str, str]) -> str:
    for pattern, replacement in rename.items():
        name = re.sub(pattern, replacement, name)
    return name


def derive(
    torch_params: Mapping[str, tuple],
    canonical: Mapping[str, tuple],
    *,  # noqa: B006
    packed: Mapping[str, tuple] = {},
    rename: Mapping[str, str] = {},
    layouts: Mapping[str, str] = {},
    torch_kinds: Mapping[str, str] = {},
    nnx_kinds: Mapping[str, str] = {},
    torch_orientations: Mapping[str, str] = {},
    torch_ties: Mapping[str, str] = {},
) -> Correspondence:
    """Link every torch parameter to the canonical tree, or raise CorrespondenceError listing all
    misses. `layouts`: {canonical name: layout}, declared (`declared_layouts` resolves a twin's
    regexes) or decided before; `torch_kinds`, `nnx_kinds`: {module path: its framework's type name}
    of the modules holding parameters (the describe steps'), which decide a ConvTranspose's
    layout; `torch_orientations`: {torch parameter: "out_in" | "in_out"}, how its module uses a
    2-D weight, probed (torch_impl/orientation.py), which decides a kernel's transpose;
    `torch_ties`: {torch name: the name it is listed under}, named where a tie leaves a tensor
    unmatched."""
    canonical = {k: tuple(v) for k, v in canonical.items()}
    torch_packed, nnx_packed = _packed_directions(torch_params, canonical, packed, rename)
    decided = dict(layouts)
    by_module: dict[tuple[str, str], str] = {}  # (normalised module, leaf) -> canonical name
    for name in canonical:
        module, leaf = module_leaf(name)
        by_module[(normalised_path(module), leaf)] = name
    links, misses = _nnx_packed_links(torch_params, canonical, nnx_packed, rename, layouts), {}
    same_name = {}  # torch name -> the NNX tensor its name matched, whose shape did not
    taken, stacked = {link.canonical[0] for link in links}, {link.torch for link in links}
    for torch_name, torch_shape in torch_params.items():
        if torch_name in stacked:
            continue
        torch_shape = tuple(torch_shape)
        module, leaf = module_leaf(renamed(torch_name, rename))
        link = None
        for modules, nnx_leaves in _attempts(module, leaf, torch_packed):
            for nnx_leaf in nnx_leaves:
                names = [by_module.get((normalised_path(m), nnx_leaf)) for m in modules]
                if all(names) and not taken.intersection(names):
                    layout = layouts.get(names[0]) or _kind_layout(
                        torch_name, names[0], torch_kinds, nnx_kinds
                    )
                    probed = (
                        None
                        if layout
                        else _probed_layout(torch_name, nnx_leaf, torch_shape, torch_orientations)
                    )
                    link = _link(
                        torch_name, torch_shape, names, nnx_leaf, canonical, layout, probed
                    )
                    if link:
                        # a probe that overrules the leaf's rule is carried to the backends
                        rule = _layout(nnx_leaf, torch_shape, canonical[names[0]])
                        if layout or probed not in (None, rule):
                            decided[names[0]] = layout or probed
                        break
                    misses[torch_name] = _shape_miss(
                        names[0], canonical[names[0]], nnx_leaf, torch_shape, layout, probed
                    )
                    same_name[torch_name] = names[0]
            if link:
                break
        if link is None:
            misses.setdefault(torch_name, "")
            continue
        misses.pop(torch_name, None)
        links.append(link)
        taken.update(link.canonical)
    order = {name: i for i, name in enumerate(torch_params)}
    links.sort(key=lambda link: order[link.torch])  # torch's order, whichever side packs
    unmatched_nnx = [n for n in canonical if n not in taken]
    if misses or unmatched_nnx:
        reshaped = {nnx: t for t, nnx in same_name.items() if t in misses and nnx in unmatched_nnx}
        ties = _ties_left(torch_ties, unmatched_nnx, rename)
        raise CorrespondenceError(
            unmatched_message(torch_params, canonical, misses, unmatched_nnx, reshaped, ties)
        )
    return Correspondence(links, canonical, torch_params, decided)


def _attempts(module: str, leaf: str, packed: Mapping[str, tuple]):
    """(NNX modules, NNX leaves) to try for a torch parameter, in order: nn.MultiheadAttention's own
    parameters by their stock counterparts; the module itself (or what `packed` says it packs); the
    module under its stock alias (`out_proj` -> `out`)."""
    join = lambda *parts: ".".join(p for p in parts if p)  # noqa: E731
    if leaf in STOCK_LEAVES:
        parts, nnx_leaf = STOCK_LEAVES[leaf]
        yield [join(module, p) for p in parts], (nnx_leaf,)
        return
    yield _packed_targets(module, packed) or [module], LEAF_RULES.get(leaf, (leaf,))
    head, _, last = module.rpartition(".")
    if last in MODULE_ALIASES:
        yield [join(head, MODULE_ALIASES[last])], LEAF_RULES.get(leaf, (leaf,))


def _shape_miss(
    nnx_name: str,
    canonical_shape: tuple,
    nnx_leaf: str,
    torch_shape: tuple,
    layout: str | None,
    probed: str | None,
) -> str:
    """Why a same-named tensor did not link: the NNX shape, and the layout tried with the torch
    shape it asks for (a layout refusal shows the two shapes as they differ)."""
    tried = layout or probed or _layout(nnx_leaf, torch_shape, canonical_shape)
    message = f"{SHAPE_DIFFERS}{nnx_name} {list(canonical_shape)}"
    if is_rearrangement(tried):
        return f"{message} under its layout {tried!r}"
    try:
        wanted = list(torch_shape_of(tried, canonical_shape))
    except (LayoutError, ValueError, IndexError):
        return message
    how = "its layout" if layout else "the layout"
    return message + (
        f" under {how} {tried!r}, which asks torch for {wanted}" if tried != SAME else ""
    )


def _probed_layout(
    torch_name: str, nnx_leaf: str, torch_shape: tuple, orientations: Mapping[str, str]
) -> str | None:
    """A 2-D weight linked to a kernel (in, out): transposed where its module computes x @ W.T
    (nn.Linear), as it is where it computes x @ W (Hugging Face's Conv1D), as the describe step's
    probe found; None where the probe could not tell (the leaf rule then applies)."""
    orientation = orientations.get(torch_name)
    if nnx_leaf != "kernel" or len(torch_shape) != 2 or orientation is None:
        return None
    return TRANSPOSE if orientation == "out_in" else SAME


def _ties_left(
    ties: Mapping[str, str], unmatched_nnx: list[str], rename: Mapping[str, str]
) -> dict[str, tuple[str, str]]:
    """{unmatched NNX tensor: (torch's second name for a tensor, the name it is listed under)} where
    the NNX tensor's module is the one a tie names (a port's own head against HF's tied one)."""
    by_module = {
        normalised_path(module_leaf(renamed(alias, rename))[0]): (alias, owner)
        for alias, owner in ties.items()
    }
    found = {}
    for name in unmatched_nnx:
        module = normalised_path(module_leaf(name)[0])
        if module in by_module:
            found[name] = by_module[module]
    return found


def _kind_layout(
    torch_name: str, nnx_name: str, torch_kinds: Mapping[str, str], nnx_kinds: Mapping[str, str]
) -> str | None:
    """A torch ConvTranspose weight's layout, from the NNX module it meets; None for any other
    tensor."""
    torch_module, leaf = module_leaf(torch_name)
    if leaf != "weight" or not torch_kinds.get(torch_module, "").startswith("ConvTranspose"):
        return None
    nnx_module = module_leaf(nnx_name)[0]
    kind = nnx_kinds.get(nnx_module, "")
    if kind == "ConvTranspose":
        return CONV_TRANSPOSE
    if kind == "ConvTranspose(transpose_kernel=True)":
        return CONV
    raise CorrespondenceError(
        f"torch {torch_module} is a {torch_kinds[torch_module]}, and its NNX counterpart "
        f"{nnx_module} is "
        f"{'a ' + kind if kind else 'no Flax module'}, not an nnx.ConvTranspose: whether its "
        "kernel is flipped cannot "
        f"be told; declare layouts={{{re.escape(nnx_name) + '$'!r}: 'conv_transpose'}} in the "
        "twin (torch's weight "
        "spatially flipped, as lax.conv_transpose uses it) or 'conv' (unflipped, as "
        "transpose_kernel=True uses it)"
    )


def declared_layouts(patterns: Mapping[str, str], canonical: Mapping[str, tuple]) -> dict[str, str]:
    """A twin's `layouts` ({regex over canonical names: layout}) by canonical name, the first
    matching regex winning; a regex that matches no parameter, or a layout that cannot be read, is
    an error."""
    out = {}
    for pattern, layout in patterns.items():
        try:
            check_layout(layout)
        except LayoutError as e:
            raise CorrespondenceError(f"layouts {{{pattern!r}: {layout!r}}}: {e}") from None
        matched = [name for name in canonical if re.search(pattern, name)]
        if not matched:
            close = difflib.get_close_matches(pattern, list(canonical), n=1, cutoff=0.0)
            raise CorrespondenceError(
                f"layouts {{{pattern!r}: ...}} matches no NNX parameter"
                f"{f' (closest {close[0]})' if close else ''}; write a regex over the NNX "
                "parameter names (nnx_params.json), or drop the declaration"
            )
        for name in matched:
            out.setdefault(name, layout)
    return out


def _declared_link(
    torch_name: str, torch_shape: tuple, names: list[str], canonical: Mapping, layout: str
) -> Link | None:
    if is_rearrangement(layout):
        if len(names) != 1:
            raise CorrespondenceError(
                f"layouts: {names[0]}'s rearrangement {layout!r} cannot apply to torch "
                f"{torch_name}, which packs {len(names)} NNX tensors; declare packed from "
                "the NNX side, or a named layout"
            )
        try:
            Rearrangement.parse(layout).sizes(torch_shape, canonical[names[0]])
        except LayoutError as e:
            raise CorrespondenceError(f"layouts: {names[0]} and torch {torch_name}: {e}") from None
        return Link(torch_name, tuple(names), layout)
    axis = packed_axis(layout, len(torch_shape)) if len(names) > 1 else 0
    if _fits(torch_shape, [torch_shape_of(layout, canonical[n]) for n in names], axis):
        return Link(torch_name, tuple(names), layout, axis=axis)
    return None


def _link(
    torch_name: str,
    torch_shape: tuple,
    names: list[str],
    nnx_leaf: str,
    canonical: Mapping,
    declared: str | None = None,
    probed: str | None = None,
) -> Link | None:
    """The link of a torch tensor to these canonical tensors, under the `declared` layout, else if
    the `probed` one (how its module uses it), or the leaf's rule, fits with a head-axis reshape or
    none."""
    if declared:
        return _declared_link(torch_name, torch_shape, names, canonical, declared)
    layout = probed or _layout(nnx_leaf, torch_shape, canonical[names[0]])
    axis = packed_axis(layout, len(torch_shape)) if len(names) > 1 else 0
    options = [_flat_shapes(canonical[n], len(torch_shape)) for n in names]
    for g in range(min(map(len, options))):
        flat = tuple(o[g] for o in options)
        if _fits(torch_shape, [torch_shape_of(layout, f) for f in flat], axis):
            reshaped = any(f != canonical[n] for f, n in zip(flat, names))
            return Link(torch_name, tuple(names), layout, flat if reshaped else (), axis=axis)
    return None


def _ends_in(path: str, key: str) -> bool:
    return path == key or path.endswith("." + key)


def _packed_directions(
    torch_params: Mapping[str, tuple],
    canonical: Mapping[str, tuple],
    packed: Mapping[str, tuple],
    rename: Mapping[str, str],
) -> tuple[dict, dict]:
    """`packed` split by direction: keys naming a torch module (after `rename`; its tensor packs the
    NNX modules), and keys naming an NNX module (its tensor packs the torch modules). A key naming
    neither is a typo, said as such rather than as a list of unmatched tensors."""
    torch_modules = sorted({module_leaf(renamed(name, rename))[0] for name in torch_params})
    nnx_modules = sorted({module_leaf(name)[0] for name in canonical})
    torch_side, nnx_side = {}, {}
    for key, parts in packed.items():
        if any(_ends_in(m, key) for m in torch_modules):
            torch_side[key] = tuple(parts)
        elif any(_ends_in(m, key) for m in nnx_modules):
            nnx_side[key] = tuple(parts)
        else:
            close = difflib.get_close_matches(key, torch_modules + nnx_modules, n=1, cutoff=0.0)
            raise CorrespondenceError(
                f"packed {{{key!r}: {tuple(parts)!r}}} matches no module: no torch or NNX module "
                f"is named {key!r} "
                f"or ends in '.{key}'{f' (closest {close[0]})' if close else ''}; name the module "
                "that packs the "
                "others (a torch module after rename, or an NNX module), or drop the declaration"
            )
    return torch_side, nnx_side


def _nnx_packed_links(
    torch_params: Mapping[str, tuple],
    canonical: Mapping[str, tuple],
    nnx_packed: Mapping[str, tuple],
    rename: Mapping[str, str],
    layouts: Mapping[str, str],
) -> list[Link]:
    """Links for NNX tensors that pack several torch tensors (a fused `qkv` kernel (E, Hq*D +
    2*Hkv*D) made of q_proj/k_proj/v_proj): each torch tensor is a block of rows of the NNX tensor
    in torch's layout."""
    by_module = {}
    for torch_name in torch_params:
        module, leaf = module_leaf(renamed(torch_name, rename))
        by_module[(normalised_path(module), leaf)] = torch_name
    links = []
    for name, shape in canonical.items():
        module, nnx_leaf = module_leaf(name)
        key = next((k for k in nnx_packed if _ends_in(module, k)), None)
        if key is None:
            continue
        prefix = module[: len(module) - len(key)]
        torch_leaf = next((t for t, nnx in LEAF_RULES.items() if nnx_leaf in nnx), nnx_leaf)
        names = [
            by_module.get((normalised_path(prefix + part), torch_leaf)) for part in nnx_packed[key]
        ]
        if not all(names):
            missing = [p for p, n in zip(nnx_packed[key], names) if not n]
            raise CorrespondenceError(
                f"packed {{{key!r}: {nnx_packed[key]!r}}}: NNX {name} {list(shape)} packs torch "
                "modules, but the torch "
                f"model has no {', '.join(prefix + p + '.' + torch_leaf for p in missing)}; name "
                "the torch modules "
                "it packs, in the order their rows stack"
            )
        layout = layouts.get(name) or _layout(nnx_leaf, tuple(torch_params[names[0]]), shape)
        rows = 0
        for torch_name in names:
            torch_shape = tuple(torch_params[torch_name])
            links.append(Link(torch_name, (name,), layout, rows=(rows, rows + torch_shape[0])))
            rows += torch_shape[0]
        stacked = (rows, *tuple(torch_params[names[0]])[1:])
        if is_rearrangement(layout):
            try:
                Rearrangement.parse(layout).sizes(stacked, shape)
            except LayoutError as e:
                raise CorrespondenceError(
                    f"layouts: NNX {name}, which packs {', '.join(names)}: {e}"
                ) from None
        elif not _fits(torch_shape_of(layout, shape), [tuple(torch_params[n]) for n in names]):
            raise CorrespondenceError(
                f"packed {{{key!r}: {nnx_packed[key]!r}}}: NNX {name} {list(shape)} is not the "
                "torch tensors "
                f"{', '.join(f'{n} {list(torch_params[n])}' for n in names)} stacked along their "
                "first axis; "
                "list the torch modules it packs, in the order of its columns"
            )
    return links

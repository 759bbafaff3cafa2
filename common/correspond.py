"""Parameter correspondence between a torch model and its NNX twin, derived from the two trees.

The canonical tree is the NNX model's (its `nnx.state(model, nnx.Param)` paths and layouts). Each torch
parameter links to one canonical tensor, or to several when it packs them (nanoGPT's `attn.qkv`). A
link is found by name, after the twin's `rename` regexes, with module paths compared case- and
underscore-blind (and blind to the `layers.` level of an `nnx.Sequential`), and the standard leaf and
layout rules:

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

`packed` works both ways: a key naming a torch module maps it to the NNX modules it packs (split along
torch's dim 0); a key naming an NNX module (a port that fuses q/k/v, the usual JAX style) maps it to the
torch modules it packs, whose tensors stack along torch's dim 0 (the NNX kernel's output columns).

Anything left unmatched on either side fails with one line listing every such tensor, its shape and
its closest candidate on the other side. Conversions are numpy and exact (transposes, splits, concats).
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from common.spec import SpecError

LEAF_RULES = {"weight": ("kernel", "embedding", "scale", "weight"), "bias": ("bias",)}
SAME, TRANSPOSE, CONV = "same", "transpose", "conv"


class CorrespondenceError(SpecError):
    """The two parameter trees do not correspond; one line listing every unmatched tensor."""


# nn.MultiheadAttention's own parameters -> nnx.MultiHeadAttention's modules and leaf (no declaration needed)
QKV = ("query", "key", "value")
STOCK_LEAVES = {"in_proj_weight": (QKV, "kernel"), "in_proj_bias": (QKV, "bias"),
                "q_proj_weight": (("query",), "kernel"), "k_proj_weight": (("key",), "kernel"),
                "v_proj_weight": (("value",), "kernel")}
MODULE_ALIASES = {"out_proj": "out"}  # tried when the torch module's own name matches nothing


@dataclass(frozen=True)
class Link:
    torch: str
    canonical: tuple[str, ...]  # several when the torch tensor packs them (split along its dim 0)
    layout: str  # SAME, TRANSPOSE or CONV
    # each canonical tensor's shape before the reshape to its own (heads split: (E, H*D) -> (E, H, D)); empty:
    # no reshape
    flat: tuple = ()
    # (start, stop) along torch's dim 0 of the one canonical tensor (in torch layout) that this torch tensor
    # is a part of, when the NNX side packs several torch tensors; empty: the whole tensor
    rows: tuple = ()


def _layout(leaf: str, torch_shape: tuple, canonical_shape: tuple) -> str:
    if leaf == "kernel":
        return TRANSPOSE if len(torch_shape) == 2 else CONV
    if len(torch_shape) == 2 and torch_shape != canonical_shape and torch_shape[::-1] == tuple(canonical_shape):
        return TRANSPOSE
    return SAME


def torch_axes(layout: str, ndim: int) -> tuple[int, ...]:
    """The canonical axes in torch's order: torch tensor = canonical.transpose(torch_axes). One
    permutation serves arrays, shapes and partition specs."""
    if layout == TRANSPOSE:
        return (1, 0)
    if layout == CONV:  # (*k, I, O) -> (O, I, *k)
        return (ndim - 1, ndim - 2, *range(ndim - 2))
    return tuple(range(ndim))


def to_torch_layout(value: np.ndarray, layout: str) -> np.ndarray:
    return value.transpose(torch_axes(layout, value.ndim))  # a view


def to_canonical_layout(value: np.ndarray, layout: str) -> np.ndarray:
    return value.transpose(np.argsort(torch_axes(layout, value.ndim)))  # a view


def _torch_shape(layout: str, canonical_shape: tuple) -> tuple:
    return tuple(canonical_shape[i] for i in torch_axes(layout, len(canonical_shape)))


def _flat_shapes(canonical_shape: tuple, torch_ndim: int) -> list[tuple]:
    """The shapes a canonical tensor may have before a reshape splits head axes, for a torch tensor of
    `torch_ndim` dimensions: itself; a LinearGeneral kernel (E, H, D) as (E, H*D) or (H, D, E) as (H*D, E);
    a bias (H, D) as (H*D,)."""
    n, size = len(canonical_shape), int(np.prod(canonical_shape))
    if n == torch_ndim:
        return [tuple(canonical_shape)]
    if torch_ndim == 1:
        return [(size,)]
    if torch_ndim == 2 and n >= 3:
        return [(canonical_shape[0], size // canonical_shape[0]), (size // canonical_shape[-1], canonical_shape[-1])]
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


def module_leaf(name: str) -> tuple[str, str]:
    module, _, leaf = name.rpartition(".")
    return module, leaf


class Correspondence:
    """The links of one twin; converts whole trees (parameters, gradients) both ways."""

    def __init__(self, links: list[Link], canonical: Mapping[str, tuple]):
        self.links = links
        self.canonical_shapes = {k: tuple(v) for k, v in canonical.items()}

    def to_canonical(self, torch_arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{torch name: array} -> {canonical name: array}, in the canonical tree's order."""
        out, stacked = {}, {}
        for link in self.links:
            value = np.asarray(torch_arrays[link.torch])
            if link.rows:  # one part of an NNX-packed tensor: stacked with its siblings below
                stacked.setdefault(link.canonical[0], []).append((link.rows[0], value, link.layout))
                continue
            parts = [value] if len(link.canonical) == 1 else np.split(value, self._offsets(link), axis=0)
            for name, part in zip(link.canonical, parts):
                out[name] = np.ascontiguousarray(to_canonical_layout(part, link.layout)).reshape(
                    self.canonical_shapes[name])
        for name, parts in stacked.items():
            whole = np.concatenate([value for _, value, _ in sorted(parts, key=lambda p: p[0])], axis=0)
            out[name] = np.ascontiguousarray(to_canonical_layout(whole, parts[0][2]))
        return {k: out[k] for k in self.canonical_shapes}

    def torch_parts(self, canonical: Mapping[str, np.ndarray]):
        """(torch name, [its parts in torch layout, as views, in row order]) per link: a packed tensor's
        parts stack along dim 0."""
        for link in self.links:
            parts = [to_torch_layout(np.asarray(canonical[n]).reshape(self._flat(link, i)), link.layout)
                     for i, n in enumerate(link.canonical)]
            yield link.torch, [parts[0][slice(*link.rows)]] if link.rows else parts

    def _flat(self, link: Link, i: int) -> tuple:
        return link.flat[i] if link.flat else self.canonical_shapes[link.canonical[i]]

    def to_torch(self, canonical: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{canonical name: array} -> {torch name: array} in torch layouts (packed tensors concatenated)."""
        return {name: np.ascontiguousarray(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0))
                for name, parts in self.torch_parts(canonical)}

    def _offsets(self, link: Link) -> list[int]:
        sizes = [_torch_shape(link.layout, self._flat(link, i))[0] for i in range(len(link.canonical))]
        return list(np.cumsum(sizes)[:-1])

    def torch_partition_specs(self, canonical_specs: Mapping[str, tuple]) -> dict[str, tuple]:
        """Canonical partition specs in torch's layout, keyed by torch name (a packed tensor takes its
        first part's spec)."""
        out = {}
        for link in self.links:
            spec = tuple(canonical_specs[link.canonical[0]])
            if link.flat:  # heads split by a reshape: the torch tensor stays whole (replicated)
                out[link.torch] = (None,) * len(self._flat(link, 0))
                continue
            spec = tuple(spec[i] for i in torch_axes(link.layout, len(spec)))
            out[link.torch] = spec
        return out


def _fits(torch_shape: tuple, parts: list[tuple]) -> bool:
    """The parts (in torch layout) make up the torch tensor: equal, or stacked along dim 0."""
    if len(parts) == 1:
        return parts[0] == torch_shape
    return all(p[1:] == torch_shape[1:] for p in parts) and sum(p[0] for p in parts) == torch_shape[0]


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


def derive(torch_params: Mapping[str, tuple], canonical: Mapping[str, tuple], *,
           packed: Mapping[str, tuple] = {}, rename: Mapping[str, str] = {}) -> Correspondence:  # noqa: B006
    """Link every torch parameter to the canonical tree, or raise CorrespondenceError listing all misses."""
    canonical = {k: tuple(v) for k, v in canonical.items()}
    torch_packed, nnx_packed = _packed_directions(torch_params, canonical, packed, rename)
    by_module: dict[tuple[str, str], str] = {}  # (normalised module, leaf) -> canonical name
    for name in canonical:
        module, leaf = module_leaf(name)
        by_module[(normalised_path(module), leaf)] = name
    links, misses = _nnx_packed_links(torch_params, canonical, nnx_packed, rename), {}
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
                    link = _link(torch_name, torch_shape, names, nnx_leaf, canonical)
                    if link:
                        break
                    misses[torch_name] = f"shape differs from {names[0]} {list(canonical[names[0]])}"
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
        raise CorrespondenceError(_unmatched_message(torch_params, canonical, misses, unmatched_nnx))
    return Correspondence(links, canonical)


def _attempts(module: str, leaf: str, packed: Mapping[str, tuple]):
    """(NNX modules, NNX leaves) to try for a torch parameter, in order: nn.MultiheadAttention's own
    parameters by their stock counterparts; the module itself (or what `packed` says it packs); the module
    under its stock alias (`out_proj` -> `out`)."""
    join = lambda *parts: ".".join(p for p in parts if p)  # noqa: E731
    if leaf in STOCK_LEAVES:
        parts, nnx_leaf = STOCK_LEAVES[leaf]
        yield [join(module, p) for p in parts], (nnx_leaf,)
        return
    yield _packed_targets(module, packed) or [module], LEAF_RULES.get(leaf, (leaf,))
    head, _, last = module.rpartition(".")
    if last in MODULE_ALIASES:
        yield [join(head, MODULE_ALIASES[last])], LEAF_RULES.get(leaf, (leaf,))


def _link(torch_name: str, torch_shape: tuple, names: list[str], nnx_leaf: str, canonical: Mapping) -> Link | None:
    """The link of a torch tensor to these canonical tensors, if some layout (and head-axis reshape) fits."""
    layout = _layout(nnx_leaf, torch_shape, canonical[names[0]])
    options = [_flat_shapes(canonical[n], len(torch_shape)) for n in names]
    for g in range(min(map(len, options))):
        flat = tuple(o[g] for o in options)
        if _fits(torch_shape, [_torch_shape(layout, f) for f in flat]):
            reshaped = any(f != canonical[n] for f, n in zip(flat, names))
            return Link(torch_name, tuple(names), layout, flat if reshaped else ())
    return None


def _ends_in(path: str, key: str) -> bool:
    return path == key or path.endswith("." + key)


def _packed_directions(torch_params: Mapping[str, tuple], canonical: Mapping[str, tuple],
                       packed: Mapping[str, tuple], rename: Mapping[str, str]) -> tuple[dict, dict]:
    """`packed` split by direction: keys naming a torch module (after `rename`; its tensor packs the NNX
    modules), and keys naming an NNX module (its tensor packs the torch modules). A key naming neither is a
    typo, said as such rather than as a list of unmatched tensors."""
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
                f"packed {{{key!r}: {tuple(parts)!r}}} matches no module: no torch or NNX module is named {key!r} "
                f"or ends in '.{key}'{f' (closest {close[0]})' if close else ''}; name the module that packs the "
                "others (a torch module after rename, or an NNX module), or drop the declaration")
    return torch_side, nnx_side


def _nnx_packed_links(torch_params: Mapping[str, tuple], canonical: Mapping[str, tuple],
                      nnx_packed: Mapping[str, tuple], rename: Mapping[str, str]) -> list[Link]:
    """Links for NNX tensors that pack several torch tensors (a fused `qkv` kernel (E, Hq*D + 2*Hkv*D) made
    of q_proj/k_proj/v_proj): each torch tensor is a block of rows of the NNX tensor in torch's layout."""
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
        names = [by_module.get((normalised_path(prefix + part), torch_leaf)) for part in nnx_packed[key]]
        if not all(names):
            missing = [p for p, n in zip(nnx_packed[key], names) if not n]
            raise CorrespondenceError(
                f"packed {{{key!r}: {nnx_packed[key]!r}}}: NNX {name} {list(shape)} packs torch modules, but the torch "
                f"model has no {', '.join(prefix + p + '.' + torch_leaf for p in missing)}; name the torch modules "
                "it packs, in the order their rows stack")
        layout = _layout(nnx_leaf, tuple(torch_params[names[0]]), shape)
        whole, rows = _torch_shape(layout, shape), 0
        for torch_name in names:
            torch_shape = tuple(torch_params[torch_name])
            links.append(Link(torch_name, (name,), layout, rows=(rows, rows + torch_shape[0])))
            rows += torch_shape[0]
        if not _fits(whole, [tuple(torch_params[n]) for n in names]):
            raise CorrespondenceError(
                f"packed {{{key!r}: {nnx_packed[key]!r}}}: NNX {name} {list(shape)} is not the torch tensors "
                f"{', '.join(f'{n} {list(torch_params[n])}' for n in names)} stacked along their first axis; "
                "list the torch modules it packs, in the order of its columns")
    return links


DETAIL_LIMIT = 12  # unmatched tensors listed per side; the summary counts them all


def _fits_any_layout(torch_shape: tuple, canonical_shape: tuple) -> bool:
    """Whether some standard layout links the two shapes (same, 2-D transposed, conv OIHW <-> HWIO)."""
    torch_shape, canonical_shape = tuple(torch_shape), tuple(canonical_shape)
    return any(_torch_shape(layout, canonical_shape) == torch_shape for layout in (SAME, TRANSPOSE, CONV)
               if layout != TRANSPOSE or len(canonical_shape) == 2)


def _closest_name(name: str, shape: tuple, pool: Mapping[str, tuple], torch_side: bool) -> str | None:
    """The most similar name in `pool` among those whose shape some layout links to `shape` (else among all)."""
    fits = [n for n, s in pool.items() if (_fits_any_layout(shape, s) if torch_side else _fits_any_layout(s, shape))]
    match = difflib.get_close_matches(name, fits or list(pool), n=1, cutoff=0.0)
    return match[0] if match else None


def _closest(name: str, shape: tuple, pool: Mapping[str, tuple], torch_side: bool) -> str:
    match = _closest_name(name, shape, pool, torch_side)
    return f"closest {match} {list(pool[match])}" if match else "no candidate left"


def _rename_hint(pairs: list[tuple[str, str]]) -> str:
    """One rename that explains the unmatched torch tensors, when each differs from its closest NNX tensor
    (by layout-aware shape) in one module component, and a few such differences explain them all."""
    swaps = set()
    for torch_name, nnx_name in pairs:
        a, b = module_leaf(torch_name)[0].split("."), module_leaf(nnx_name)[0].split(".")
        diff = [(x, y) for x, y in zip(a, b) if x != y]
        if len(a) != len(b) or len(diff) != 1:
            return ""
        swaps.add(diff[0])
    if not swaps or len(swaps) > 4:
        return ""
    rule = ", ".join(f"r'(^|\\.){re.escape(x)}\\.': r'\\1{y}.'" for x, y in sorted(swaps))
    return f" (rename {{{rule}}} in the twin would match all {len(pairs)})"


def _listed(items: list[str]) -> str:
    more = len(items) - DETAIL_LIMIT
    return "; ".join(items[:DETAIL_LIMIT]) + (f"; ... and {more} more" if more > 0 else "")


def _unmatched_message(torch_params, canonical, misses: dict, unmatched_nnx: list[str]) -> str:
    left_torch = {n: torch_params[n] for n in misses}
    left_nnx = {n: canonical[n] for n in unmatched_nnx}
    torch_items = [f"{n} {list(torch_params[n])} ({why or _closest(n, torch_params[n], left_nnx or canonical, True)})"
                   for n, why in misses.items()]
    nnx_items = [f"{n} {list(canonical[n])} ({_closest(n, canonical[n], left_torch or torch_params, False)})"
                 for n in unmatched_nnx]
    pairs = [(n, _closest_name(n, torch_params[n], left_nnx, True)) for n in misses] if left_nnx else []
    hint = _rename_hint(pairs) if pairs and all(b for _, b in pairs) and len(misses) == len(unmatched_nnx) else ""
    return (f"the torch and NNX parameter trees do not correspond{hint}: torch has {len(torch_items)} unmatched "
            f"[{_listed(torch_items)}], NNX has {len(nnx_items)} unmatched [{_listed(nnx_items)}]; name the "
            "modules alike, or declare packed/rename in the twin")

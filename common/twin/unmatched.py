"""The one-line message of two parameter trees that do not correspond (common/twin/correspond.py): a
summary first (with the one rename that would match them all, when there is one), then each
unmatched tensor with its closest candidate on the other side, chosen among the shapes some layout
links."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping

from common.spec.layouts import CONV, SAME, TRANSPOSE
from common.spec.layouts import torch_shape as torch_shape_of


def module_leaf(name: str) -> tuple[str, str]:
    module, _, leaf = name.rpartition(".")
    return module, leaf


DETAIL_LIMIT = 12  # unmatched tensors listed per side; the summary counts them all
# a torch tensor matched by name to an NNX one of another shape
SHAPE_DIFFERS = "shape differs from "


def _fits_any_layout(torch_shape: tuple, canonical_shape: tuple) -> bool:
    """Whether some standard layout links the two shapes (same, 2-D transposed, conv OIHW <->
    HWIO)."""
    torch_shape, canonical_shape = tuple(torch_shape), tuple(canonical_shape)
    return any(
        torch_shape_of(layout, canonical_shape) == torch_shape
        for layout in (SAME, TRANSPOSE, CONV)
        if layout != TRANSPOSE or len(canonical_shape) == 2
    )


def _is_bias(name: str) -> bool:
    return module_leaf(name)[1] == "bias"


def _natural_fit(nnx_name: str, nnx_shape: tuple, torch_shape: tuple) -> bool:
    """Whether the two shapes are linked by the layout the NNX leaf implies: a 2-D `kernel` is a
    Linear's (torch's weight transposed), a 4-D one a convolution's, anything else the same shape (a
    Linear kernel of (16, 64) is torch's (64, 16) weight, not another Linear's (16, 64))."""
    kernel = module_leaf(nnx_name)[1] == "kernel"
    layout = (
        TRANSPOSE
        if kernel and len(nnx_shape) == 2
        else CONV
        if kernel and len(nnx_shape) == 4
        else SAME
    )
    return torch_shape_of(layout, tuple(nnx_shape)) == tuple(torch_shape)


def _closest_name(
    name: str, shape: tuple, pool: Mapping[str, tuple], torch_side: bool
) -> str | None:
    """The most similar name in `pool` among those whose shape some layout links to `shape` and that
    are a bias when `name` is one (a norm's weight of 16 is not an SE convolution's bias of 16),
    preferring the layout the NNX leaf implies; else among the shapes that fit, else those of as
    many elements, else among all."""
    fits = [
        n
        for n, s in pool.items()
        if (_fits_any_layout(shape, s) if torch_side else _fits_any_layout(s, shape))
    ]
    alike = [n for n in fits if _is_bias(n) == _is_bias(name)]
    natural = [
        n
        for n in alike
        if (_natural_fit(n, pool[n], shape) if torch_side else _natural_fit(name, shape, pool[n]))
    ]
    sized = [n for n, s in pool.items() if math.prod(s) == math.prod(shape)]
    match = difflib.get_close_matches(
        name, natural or alike or fits or sized or list(pool), n=1, cutoff=0.0
    )
    return match[0] if match else None


def _closest(name: str, shape: tuple, pool: Mapping[str, tuple], torch_side: bool) -> str:
    match = _closest_name(name, shape, pool, torch_side)
    return f"closest {match} {list(pool[match])}" if match else "no candidate left"


def _rename_hint(pairs: list[tuple[str, str]]) -> str:
    """One rename that explains the unmatched torch tensors, when each differs from its closest NNX
    tensor (by layout-aware shape) in one module component, and a few such differences explain them
    all."""
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


def _tie(nnx_name: str, alias: str, owner: str) -> str:
    module = module_leaf(nnx_name)[0]
    return (
        f"torch's {alias} is {owner}: tied, one tensor; compute the port's {module} from that "
        "tensor (e.g. nnx.Embed.attend), or build the torch side untied "
        "(tie_word_embeddings=False)"
    )


def unmatched_message(
    torch_params,
    canonical,
    misses: dict,
    unmatched_nnx: list[str],
    reshaped: Mapping[str, str] = {},
    ties: Mapping[str, tuple[str, str]] = {},
) -> str:  # noqa: B006
    """`reshaped`: {NNX name: the torch tensor whose name matched it but not its shape}: named back,
    not the closest shape; `ties`: {NNX name: (torch's tied name, the tensor it is)}: the tie
    named."""
    left_torch = {n: torch_params[n] for n in misses}
    left_nnx = {n: canonical[n] for n in unmatched_nnx}
    torch_items = [
        f"{n} {list(torch_params[n])} "
        f"({why or _closest(n, torch_params[n], left_nnx or canonical, True)})"
        for n, why in misses.items()
    ]
    nnx_items = [
        f"{n} {list(canonical[n])} ("
        + (
            f"{SHAPE_DIFFERS}{reshaped[n]} {list(torch_params[reshaped[n]])}"
            if n in reshaped
            else _tie(n, *ties[n])
            if n in ties
            else _closest(n, canonical[n], left_torch or torch_params, False)
        )
        + ")"
        for n in unmatched_nnx
    ]
    pairs = (
        [(n, _closest_name(n, torch_params[n], left_nnx, True)) for n in misses] if left_nnx else []
    )
    hint = (
        _rename_hint(pairs)
        if pairs and all(b for _, b in pairs) and len(misses) == len(unmatched_nnx)
        else ""
    )
    return (
        f"the torch and NNX parameter trees do not correspond{hint}: torch has {len(torch_items)} "
        "unmatched "
        f"[{_listed(torch_items)}], NNX has {len(nnx_items)} unmatched [{_listed(nnx_items)}]; "
        "name the "
        "modules alike, or declare packed/rename in the twin"
        + (
            "; a tensor whose shape alone differs needs its layout declared (layouts={regex: 'A "
            "-> B'}, "
            "e.g. 'd 1 1 -> d')"
            if reshaped
            else ""
        )
    )

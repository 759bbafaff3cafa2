"""Framework-neutral dropout masks (`--parity-mode exact`, `train.dropout_masks=common`).

With these masks every backend's dropout multiplies by the same numbers, so a
run with dropout can be checked tensor by tensor like a deterministic one.
Each dropout call of a step, counted in call order from 0, multiplies its input
by `draw_mask(seed, step, call, shape, rate)`: float32, 1 / (1 - rate) where a
uniform draw from `np.random.default_rng([seed, MASK_STREAM, step, call])`
(PCG64: bit-stable across machines) is >= rate, else 0. A prefix of a larger
draw is the smaller draw, so the step-0 activation capture (the first sequence
of step 0's batch) sees the first row of step 0's masks.

Each framework replaces its dropout by a call of `MaskFeed.next` while a step
traces or runs (torch_impl/masks.py, jax_impl/masks.py): eager runtimes draw
each mask when the call needs it; jitted ones get a step's masks as step
inputs, drawn from the calls (`sites`) an abstract trace recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from common.vocab import MaskSource

MASK_STREAM = 0x6D61736B  # apart from every data stream (common/data/ seeds with 3 entries)


class DropoutSite(NamedTuple):
    """One dropout call of a step: the shape of its input and its rate."""

    shape: tuple[int, ...]
    rate: float

    def __str__(self) -> str:
        return f"[{','.join(map(str, self.shape))}]@{self.rate:g}"


def record_sites(record, spec, sites) -> None:
    """The run record's `extra.dropout_sites` (step 0's dropout calls) when the run was fed common's
    masks: compare names a port whose calls differ. Every runtime records them through this."""
    if spec.train.dropout_masks == MaskSource.COMMON:
        record.extra.dropout_sites = [str(site) for site in sites]


def draw_mask(seed: int, step: int, call: int, shape: tuple[int, ...], rate: float) -> np.ndarray:
    """The scaled keep-mask of dropout call `call` of step `step`."""
    uniform = np.random.default_rng([seed, MASK_STREAM, step, call]).random(shape, dtype=np.float32)
    return np.where(uniform >= np.float32(rate), np.float32(1.0 / (1.0 - rate)), np.float32(0.0))


def draw_masks(seed: int, step: int, sites: list[DropoutSite]) -> tuple[np.ndarray, ...]:
    """Every mask of a step, in call order."""
    return tuple(
        draw_mask(seed, step, call, site.shape, site.rate) for call, site in enumerate(sites)
    )


class MaskError(RuntimeError):
    """A dropout call the masks were not drawn for (the traced calls differ from the recorded
    ones)."""


class MaskFeed:
    """Hands a step's dropout calls their masks in call order, and records the calls (`sites`).

    `mask_for(call, shape, rate)` gives call `call`'s mask as a framework array; without it the feed
    only records, and the dropout passes its input through (the abstract trace that finds the
    sites)."""

    def __init__(self, mask_for: Callable | None = None):
        self.mask_for, self.sites = mask_for, []

    def next(self, shape, rate: float):
        site = DropoutSite(tuple(int(d) for d in shape), float(rate))
        self.sites.append(site)
        return (
            None
            if self.mask_for is None
            else self.mask_for(len(self.sites) - 1, site.shape, site.rate)
        )


def drawing_feed(seed: int, step: int, to_framework: Callable[[np.ndarray], object]) -> MaskFeed:
    """The feed of an eager step: each call's mask drawn when the call asks for it."""
    return MaskFeed(
        lambda call, shape, rate: to_framework(draw_mask(seed, step, call, shape, rate))
    )


def given_feed(masks, to_framework: Callable = lambda m: m) -> MaskFeed:
    """The feed of a traced step: the masks it was given (drawn for the recorded sites), checked by
    shape."""

    def mask_for(call: int, shape: tuple[int, ...], rate: float):
        if call >= len(masks) or tuple(masks[call].shape) != shape:
            drawn = tuple(masks[call].shape) if call < len(masks) else "none"
            raise MaskError(
                f"dropout call {call} takes a {list(shape)} input but the mask drawn for it is "
                f"{drawn}: the model's dropout calls changed between tracings"
            )
        return to_framework(masks[call])

    return MaskFeed(mask_for)

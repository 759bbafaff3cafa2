"""torch's dropout fed common's masks (common/data/masks.py), for every torch runtime: eager,
torch_xla, torchax.

While `fed_dropout(feed)` is open, `torch.nn.functional.dropout` (what `nn.Dropout` and
`nn.MultiheadAttention` call) multiplies its input by the feed's next mask instead of drawing one:
the model stays as its author wrote it. Outside it, torch is untouched.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F

from common.data.masks import MaskFeed, drawing_feed
from common.spec import RunSpec
from common.vocab import MaskSource


@contextlib.contextmanager
def fed_dropout(feed: MaskFeed):
    def dropout(input, p: float = 0.5, training: bool = True, inplace: bool = False):
        if not training or p == 0.0:
            return input
        mask = feed.next(input.shape, p)
        return input if mask is None else input * mask.to(input.dtype)

    original = F.dropout
    F.dropout = dropout
    try:
        yield feed
    finally:
        F.dropout = original


def step_masks(spec: RunSpec, step: int, device: torch.device):
    """The context a torch step runs in: common's masks of `step` on `device` when the spec asks for
    them (train.dropout_masks=common), else torch's own dropout."""
    if spec.train.dropout_masks != MaskSource.COMMON:
        return contextlib.nullcontext()
    return fed_dropout(
        drawing_feed(
            spec.train.mask_seed,
            step,
            lambda mask: torch.from_numpy(np.ascontiguousarray(mask)).to(device),
        )
    )

"""NNX's dropout fed common's masks (common/data/masks.py): the twin of torch_impl/masks.py.

While `fed_dropout(feed)` is open, every `nnx.Dropout` multiplies its input by the feed's next mask
instead of drawing one from its RNG stream (which then does not advance). Outside it, flax is
untouched.
"""

from __future__ import annotations

import contextlib

from flax import nnx

from common.data.masks import MaskFeed
from common.spec import SpecError


@contextlib.contextmanager
def fed_dropout(feed: MaskFeed):
    def call(self, inputs, *, deterministic: bool | None = None, rngs=None):
        deterministic = self.deterministic if deterministic is None else deterministic
        if self.rate == 0.0 or deterministic:
            return inputs
        if self.broadcast_dims:
            raise SpecError(
                f"nnx.Dropout(broadcast_dims={self.broadcast_dims}) shares its mask across axes; "
                "common's masks are drawn per element: use the framework's masks for this model"
            )
        mask = feed.next(inputs.shape, self.rate)
        return inputs if mask is None else inputs * mask.astype(inputs.dtype)

    original = nnx.Dropout.__call__
    nnx.Dropout.__call__ = call
    try:
        yield feed
    finally:
        nnx.Dropout.__call__ = original

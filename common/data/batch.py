"""What every dataset gives and shares: the batch, its error, and the seeded random streams (numpy
only).

A batch is `Batch(inputs, targets)`: arrays of a built-in task (common/data/), or of a twin's own
batches (common/data/batches.py) dicts of named arrays, the forward's and the loss's own."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# Independent random streams of one data seed.
TEACHER, EXAMPLES, EPOCH_ORDER, OFFSETS, CHAIN = range(5)


class DataError(ValueError):
    """Data that cannot feed this spec; one line naming the file or field."""


class Batch(NamedTuple):
    inputs: np.ndarray | dict
    targets: np.ndarray | dict


def seeded_rng(seed: int, stream: int, index: int) -> np.random.Generator:
    """The generator of one stream of a data seed: PCG64, bit-stable across platforms."""
    return np.random.default_rng([seed, stream, index])

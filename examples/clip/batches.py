"""Image-caption batches for the CLIP example, numpy only: each example's image is a fixed random
pattern of its class plus noise, its caption the class's fixed token sequence (varied in length),
started by BOS, ended by EOS, right-padded with 0 and masked. Deterministic in (seed, step); every
class differs, so the contrastive loss has something to learn."""

from __future__ import annotations

import numpy as np

CLASSES = 16


def image_caption_batch(
    seed: int, step: int, batch_size: int, vocab_size: int, seq_len: int, image_size: int, **_
) -> dict[str, np.ndarray]:
    fixed = np.random.default_rng([seed, 1 << 20])
    patterns = fixed.standard_normal((CLASSES, 3, image_size, image_size)).astype(np.float32)
    words = fixed.integers(1, vocab_size - 2, (CLASSES, seq_len))
    lengths = fixed.integers(3, seq_len - 1, CLASSES)
    rng = np.random.default_rng([seed, step])
    classes = (
        rng.permutation(CLASSES)[:batch_size]
        if batch_size <= CLASSES
        else rng.integers(0, CLASSES, batch_size)
    )
    pixels = patterns[classes] + 0.5 * rng.standard_normal(
        (batch_size, 3, image_size, image_size)
    ).astype(np.float32)
    ids = np.zeros((batch_size, seq_len), np.int64)
    mask = np.zeros((batch_size, seq_len), np.int64)
    for i, c in enumerate(classes):
        n = lengths[c]
        ids[i, 0], ids[i, 1 : n + 1], ids[i, n + 1] = vocab_size - 2, words[c, :n], vocab_size - 1
        mask[i, : n + 2] = 1
    return {
        "input_ids": ids.astype(np.int32),
        "pixel_values": pixels,
        "attention_mask": mask.astype(np.int32),
    }

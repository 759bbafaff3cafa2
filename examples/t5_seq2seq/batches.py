"""Sequence-to-sequence batches for the T5 example, numpy only: each source is a run of random words
of its own length (8-15 tokens), right-padded to 15 with its attention mask; its target is the same
words reversed, then end-of-sequence, `labels` -100 past it (the decoder reads the labels shifted
right: teacher forcing, on both sides). Deterministic in (seed, step)."""

from __future__ import annotations

import numpy as np

PAD, EOS, FIRST_WORD = 0, 1, 2
IGNORE = -100  # Hugging Face's label of the positions the loss skips


def reverse_batch(
    seed: int, step: int, batch_size: int, vocab_size: int, source_len: int = 15
) -> dict:
    rng = np.random.default_rng([seed, step])
    lengths = rng.integers(source_len // 2 + 1, source_len + 1, batch_size)
    words = rng.integers(FIRST_WORD, vocab_size, (batch_size, source_len))
    real = np.arange(source_len)[None, :] < lengths[:, None]
    labels = np.full((batch_size, source_len + 1), IGNORE, np.int64)
    for row, length in enumerate(lengths):
        labels[row, :length] = words[row, :length][::-1]
        labels[row, length] = EOS
    return {
        "input_ids": np.where(real, words, PAD).astype(np.int32),
        "attention_mask": real.astype(np.int32),
        "labels": labels.astype(np.int32),
    }

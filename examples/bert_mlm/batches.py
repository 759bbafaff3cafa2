"""Masked-LM batches for the BERT example, numpy only: sentence pairs of varied length, right-padded
to `seq_len` with their attention mask, token types A | B, and 15% of the real tokens chosen for
prediction (BERT's recipe: 80% of them replaced by [MASK], 10% by a random token, 10% kept),
`labels` -100 everywhere else. The tokens follow a fixed sparse Markov chain, so that the model has
something to learn. Deterministic in (seed, step).
"""

from __future__ import annotations

import numpy as np

PAD, MASK, FIRST_WORD = 0, 1, 2  # ids below FIRST_WORD are special tokens
IGNORE = -100  # Hugging Face's label of the positions the loss skips


def mlm_batch(
    seed: int, step: int, batch_size: int, vocab_size: int, seq_len: int
) -> dict[str, np.ndarray]:
    chain = np.random.default_rng([seed, 1 << 20]).integers(FIRST_WORD, vocab_size, (vocab_size, 4))
    rng = np.random.default_rng([seed, step])
    lengths = rng.integers(seq_len // 2, seq_len + 1, batch_size)
    tokens = np.full((batch_size, seq_len), PAD, np.int64)
    tokens[:, 0] = rng.integers(FIRST_WORD, vocab_size, batch_size)
    for i in range(1, seq_len):
        tokens[:, i] = chain[tokens[:, i - 1], rng.integers(0, 4, batch_size)]
    real = np.arange(seq_len)[None, :] < lengths[:, None]
    tokens[~real] = PAD
    types = (np.arange(seq_len)[None, :] >= (lengths // 2)[:, None]) & real
    chosen = real & (rng.random((batch_size, seq_len)) < 0.15)
    chosen[np.arange(batch_size), 0] = True  # at least one prediction per sequence
    labels = np.where(chosen, tokens, IGNORE)
    roll = rng.random((batch_size, seq_len))
    inputs = np.where(chosen & (roll < 0.8), MASK, tokens)
    inputs = np.where(
        chosen & (roll >= 0.8) & (roll < 0.9),
        rng.integers(FIRST_WORD, vocab_size, tokens.shape),
        inputs,
    )
    return {
        "input_ids": inputs.astype(np.int32),
        "attention_mask": real.astype(np.int32),
        "token_type_ids": types.astype(np.int32),
        "labels": labels.astype(np.int32),
    }

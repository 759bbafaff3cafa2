"""Hugging Face's own `T5ForConditionalGeneration`, used as it is for the torch side: built from a
`T5Config` of the twin's hyperparameters (no download), with the gated-GELU feed-forward (`wi_0`
through `gelu_new`, the tanh approximation, times `wi_1`, then `wo`), no dropout, RMSNorm eps 1e-6,
eager attention and Hugging Face's default tied head: the LM head is the shared token table, the
decoder's output scaled by d_model**-0.5 first. `shared`, `encoder.embed_tokens`,
`decoder.embed_tokens` and `lm_head` are one tensor: named_parameters lists it once, as
`shared.weight`."""

from __future__ import annotations

from transformers import T5Config, T5ForConditionalGeneration


def t5(
    vocab_size: int,
    d_model: int,
    d_kv: int,
    d_ff: int,
    n_layers: int,
    n_heads: int,
    rel_buckets: int,
    rel_max_distance: int,
) -> T5ForConditionalGeneration:
    config = T5Config(
        vocab_size=vocab_size,
        d_model=d_model,
        d_kv=d_kv,
        d_ff=d_ff,
        num_layers=n_layers,
        num_decoder_layers=n_layers,
        num_heads=n_heads,
        relative_attention_num_buckets=rel_buckets,
        relative_attention_max_distance=rel_max_distance,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
        layer_norm_epsilon=1e-6,
        initializer_factor=1.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        use_cache=False,
        attn_implementation="eager",
    )
    return T5ForConditionalGeneration(config)

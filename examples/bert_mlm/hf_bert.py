"""Hugging Face's own `BertForMaskedLM`, used as it is for the torch side: built from a `BertConfig`
of the twin's hyperparameters (no download). Post-LayerNorm encoder, exact (erf) GELU, no dropout,
an MLM head whose decoder weight is the word-embedding matrix itself (HF's default
`tie_word_embeddings=True`) and whose decoder bias is `cls.predictions.bias` (`decoder.bias` is the
same tensor): named_parameters lists each tied tensor once, state_dict under both names."""

from __future__ import annotations

from transformers import BertConfig, BertForMaskedLM


def bert(
    vocab_size: int,
    seq_len: int,
    d_model: int,
    n_layers: int,
    n_heads: int,
    d_ff: int,
    type_vocab_size: int,
    layer_norm_eps: float,
) -> BertForMaskedLM:
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=d_model,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        intermediate_size=d_ff,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        max_position_embeddings=seq_len,
        type_vocab_size=type_vocab_size,
        layer_norm_eps=layer_norm_eps,
        initializer_range=0.02,
        attn_implementation="eager",
    )
    return BertForMaskedLM(config)

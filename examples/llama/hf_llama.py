"""Hugging Face's own `LlamaForCausalLM`, used as it is for the torch side: built from a
`LlamaConfig` of the twin's hyperparameters (no download), its forward returning a
`CausalLMOutputWithPast` (the toolkit takes `.logits`), its attention called with keyword arguments
(the step-0 capture sees them)."""

from __future__ import annotations

from transformers import LlamaConfig, LlamaForCausalLM


def llama(
    vocab_size: int,
    seq_len: int,
    d_model: int,
    n_layers: int,
    n_heads: int,
    n_kv_heads: int,
    d_ff: int,
    rms_eps: float = 1e-5,
    rope_theta: float = 10000.0,
) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=d_model,
        intermediate_size=d_ff,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=seq_len,
        rms_norm_eps=rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        use_cache=False,
        initializer_range=0.02,
        attn_implementation="eager",
    )
    return LlamaForCausalLM(config)

"""Hugging Face's own `Qwen2ForCausalLM`, used as it is for the torch side: built from a
`Qwen2Config` of the twin's hyperparameters (no download). Its attention keeps q, k and v as three
biased projections (`q_proj`, `k_proj`, `v_proj`) where the NNX port fuses them; the twin's `packed`
says so."""

from __future__ import annotations

from transformers import Qwen2Config, Qwen2ForCausalLM


def qwen2(
    vocab_size: int,
    seq_len: int,
    d_model: int,
    n_layers: int,
    n_heads: int,
    n_kv_heads: int,
    d_ff: int,
    rms_eps: float,
    rope_theta: float,
) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=d_model,
        intermediate_size=d_ff,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=seq_len,
        rms_norm_eps=rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        tie_word_embeddings=False,
        use_sliding_window=False,
        use_cache=False,
        initializer_range=0.02,
        attn_implementation="eager",
    )
    return Qwen2ForCausalLM(config)

"""Hugging Face's own `Gemma2ForCausalLM`, used as it is for the torch side: built from a
`Gemma2Config` of the twin's hyperparameters (no download). What sets Gemma 2 apart, all kept:
its embedding scaled by sqrt(hidden) in a subclass of nn.Embedding with a forward of its own (pad
id 0, as Gemma ships), RMSNorm scaling by (1 + w), four norms a layer, attention scaled by
`query_pre_attn_scalar`**-0.5 with its logits soft-capped, a sliding window on every other layer,
and the final logits soft-capped; its head is tied to the embedding."""

from __future__ import annotations

from transformers import Gemma2Config, Gemma2ForCausalLM


def gemma2(
    vocab_size: int,
    seq_len: int,
    d_model: int,
    n_layers: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    d_ff: int,
    rms_eps: float,
    rope_theta: float,
    query_pre_attn_scalar: int,
    sliding_window: int,
    attn_softcap: float,
    final_softcap: float,
) -> Gemma2ForCausalLM:
    config = Gemma2Config(
        vocab_size=vocab_size,
        hidden_size=d_model,
        intermediate_size=d_ff,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=seq_len,
        rms_norm_eps=rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        query_pre_attn_scalar=query_pre_attn_scalar,
        sliding_window=sliding_window,
        attn_logit_softcapping=attn_softcap,
        final_logit_softcapping=final_softcap,
        hidden_activation="gelu_pytorch_tanh",
        pad_token_id=0,
        tie_word_embeddings=True,
        use_cache=False,
        attn_implementation="eager",
    )
    return Gemma2ForCausalLM(config)

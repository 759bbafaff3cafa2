"""Hugging Face's own `GPT2LMHeadModel`, used as it is for the torch side: built from a `GPT2Config`
of the twin's hyperparameters (no download). Its projections are `Conv1D` modules, whose weights are
(in, out), the transpose of nn.Linear's; its head is tied to the token embedding. Dropout is off
(the toolkit compares deterministic steps)."""

from __future__ import annotations

from transformers import GPT2Config, GPT2LMHeadModel


def gpt2(
    vocab_size: int, seq_len: int, d_model: int, n_layers: int, n_heads: int, ln_eps: float
) -> GPT2LMHeadModel:
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=seq_len,
        n_embd=d_model,
        n_layer=n_layers,
        n_head=n_heads,
        layer_norm_epsilon=ln_eps,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
        attn_implementation="eager",
    )
    return GPT2LMHeadModel(config)

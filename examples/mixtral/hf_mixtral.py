"""Hugging Face's own `MixtralForCausalLM`, used as it is for the torch side: built from a
`MixtralConfig` of the twin's hyperparameters (no download). Its sparse MoE block routes each token
to `top_k` of `n_experts` experts with `torch.topk` over the router's softmax (`mlp.gate`, a
`MixtralTopKRouter` returning logits, weights and indices) and runs them through stacked expert
weights (`mlp.experts.gate_up_proj` (E, 2I, D), `down_proj` (E, D, I)), called as
`experts(hidden_states, top_k_index, top_k_weights)`.

`mixtral_router_zeroed` and `mixtral_router_near_ties` start from a router whose logits tie
(exactly: a zero-initialised router, as a freshly added MoE layer often is) or nearly (a router
scaled down to 1e-6 of its init, where rounding decides the order): a correct port may route some
tokens to other experts there.
"""

from __future__ import annotations

import torch
from transformers import MixtralConfig, MixtralForCausalLM


def mixtral(
    vocab_size: int,
    seq_len: int,
    d_model: int,
    n_layers: int,
    n_heads: int,
    n_kv_heads: int,
    d_ff: int,
    n_experts: int,
    top_k: int,
    rms_eps: float,
    rope_theta: float,
    kernel: str = "reference",
) -> MixtralForCausalLM:
    """Mixtral as it ships; `kernel` is the NNX side's switch (its grouped matmul), whose
    reference is this model's own experts."""
    del kernel
    config = MixtralConfig(
        vocab_size=vocab_size,
        hidden_size=d_model,
        intermediate_size=d_ff,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        num_local_experts=n_experts,
        num_experts_per_tok=top_k,
        max_position_embeddings=seq_len,
        rms_norm_eps=rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        tie_word_embeddings=False,
        use_cache=False,
        router_jitter_noise=0.0,
        output_router_logits=False,
        initializer_range=0.02,
        attn_implementation="eager",
    )
    return MixtralForCausalLM(config)


def mixtral_eager_experts(**hparams) -> MixtralForCausalLM:
    """Mixtral with its experts run one by one (`experts_implementation="eager"`): torch's
    grouped_mm has no float64 kernel, so the float64 proof needs this build."""
    model = mixtral(**hparams)
    model.set_experts_implementation("eager")
    return model


def _routers(model: MixtralForCausalLM):
    return [layer.mlp.gate.weight for layer in model.model.layers]


def mixtral_router_zeroed(**hparams) -> MixtralForCausalLM:
    model = mixtral(**hparams)
    with torch.no_grad():
        for weight in _routers(model):
            weight.zero_()
    return model


def mixtral_router_near_ties(**hparams) -> MixtralForCausalLM:
    model = mixtral(**hparams)
    with torch.no_grad():
        for weight in _routers(model):
            weight.mul_(1e-6)
    return model

"""The Mixtral example twin: Hugging Face's own `MixtralForCausalLM` as the torch side, unchanged
(hf_mixtral.py), and an NNX port with dense expert dispatch and its own names (nnx_mixtral.py). This
file imports no framework.

    python -m compare --twin examples/mixtral/twin.py:mixtral_tiny --backend jax,torch
    python -m compare --twin examples/mixtral/twin.py:mixtral_router_zeroed  # routing ties
    python -m compare --twin examples/mixtral/twin.py:mixtral_softmax_over_tokens  # layers.0.moe
    python -m compare --twin examples/mixtral/twin.py:mixtral_not_renormalised  # fails
    python -m compare --twin examples/mixtral/twin.py:mixtral_gelu_experts  # fails

(each with --backend jax,torch to run the two in seconds)
"""

import dataclasses

from common.spec import TrainSpec
from common.twin import Twin

HPARAMS = {
    "vocab_size": 256,
    "seq_len": 32,
    "d_model": 64,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "d_ff": 96,
    "n_experts": 4,
    "top_k": 2,
    "rms_eps": 1e-5,
    "rope_theta": 1000000.0,
}

# a save_pretrained directory of MixtralForCausalLM loads as from_pretrained loads it
# (common/twin/hf.py stacks the per-expert layout transformers writes by default); these config
# fields must equal the hparams
HF = {
    "model_type": "mixtral",
    "prefix": "",
    "config": {
        "vocab_size": "vocab_size",
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
        "num_key_value_heads": "n_kv_heads",
        "intermediate_size": "d_ff",
        "num_local_experts": "n_experts",
        "num_experts_per_tok": "top_k",
        "rms_norm_eps": "rms_eps",
        "rope_parameters.rope_theta": "rope_theta",
    },
}

mixtral_tiny = Twin(
    torch="hf_mixtral.py:mixtral",
    nnx="nnx_mixtral.py:Mixtral",
    task="lm",
    hparams=HPARAMS,
    rename={
        r"^model\.": "",
        r"\.self_attn\.": ".attn.",
        r"\.mlp\.gate\b": ".moe.router",
        r"\.mlp\.": ".moe.",
        r"\.experts\.gate_up_proj$": ".experts.gate_up",
        r"\.experts\.down_proj$": ".experts.down",
    },
    # the stacked experts: torch keeps each expert's (out, in) matrix, the port (in, out)
    layouts={"experts.gate_up": "e o i -> e i o", "experts.down": "e o i -> e i o"},
    hf=HF,
    nnx_dtype_arg="dtype",  # the port computes in bfloat16 under --dtype bfloat16
    train=TrainSpec(
        optimizer="adamw",
        lr=3e-3,
        weight_decay=0.1,
        beta2=0.95,
        schedule="warmup_cosine",
        schedule_warmup_steps=5,
        global_batch_size=8,
        steps=10,
    ),
)

mixtral_router_zeroed = dataclasses.replace(
    mixtral_tiny, torch="hf_mixtral.py:mixtral_router_zeroed"
)
mixtral_router_near_ties = dataclasses.replace(
    mixtral_tiny, torch="hf_mixtral.py:mixtral_router_near_ties"
)
mixtral_softmax_over_tokens = dataclasses.replace(
    mixtral_tiny, nnx="nnx_mixtral.py:mixtral_softmax_over_tokens"
)
mixtral_not_renormalised = dataclasses.replace(
    mixtral_tiny, nnx="nnx_mixtral.py:mixtral_not_renormalised"
)
mixtral_gelu_experts = dataclasses.replace(mixtral_tiny, nnx="nnx_mixtral.py:mixtral_gelu_experts")
mixtral_top_k_experts = dataclasses.replace(
    mixtral_tiny, nnx="nnx_mixtral.py:mixtral_top_k_experts"
)
mixtral_top_k_not_renormalised = dataclasses.replace(
    mixtral_tiny, nnx="nnx_mixtral.py:mixtral_top_k_not_renormalised"
)

# the NNX side's experts as one grouped matmul a projection (jax.lax.ragged_dot) where the
# reference is its dense dispatch: --jax-set model.kernel=ragged_dot, judged by its noise floor
# (its torch side's experts run one by one, eager: float64 proves it too)
mixtral_kernels = dataclasses.replace(
    mixtral_tiny,
    torch="hf_mixtral.py:mixtral_eager_experts",
    hparams={**HPARAMS, "kernel": "reference"},
    kernel_arg="kernel",
)

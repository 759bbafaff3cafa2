"""The Llama example twin, as a user declares one: this file imports no framework (compare imports
it in a subprocess of its own); the two models live in torch_llama.py and nnx_llama.py.

    python -m compare --twin examples/llama/twin.py:llama_tiny --backend both
    python -m compare --twin examples/llama/twin.py:llama_tiny --mesh data=2,tensor=2
    # fails at layer 0's attention
    python -m compare --twin examples/llama/twin.py:llama_tiny_misported
    # fails at a rotary buffer
    python -m compare --twin examples/llama/twin.py:llama_table_misported
    # transformers' own class
    python -m compare --twin examples/llama/twin.py:llama_hf --checkpoint hf:DIR
    # its decode path too: prefill, 16 greedy tokens, the KV caches compared step by step
    python -m compare --twin examples/llama/twin.py:llama_hf --generate 16
    # the NNX side's Pallas kernels (flash attention, a fused RMSNorm) against SDPA
    python -m compare --twin examples/llama/twin.py:llama_kernels --jax-set model.kernel=pallas \
        --backend jax,torch --activations
"""

import dataclasses

from common.spec import TrainSpec
from common.twin import Twin

HPARAMS = {
    "vocab_size": 256,
    "seq_len": 64,
    "d_model": 64,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "d_ff": 176,
    "rms_eps": 1e-5,
    "rope_theta": 10000.0,
}

# Megatron's tensor-parallel layout over the NNX (canonical) names: column-parallel q/k/v, gate and
# up (their output columns split), row-parallel o and down (their
# input rows), a vocab-parallel head.
PARTITION_RULES = (
    (r"attn\.(q|k|v)_proj\.kernel$", (None, "tensor")),
    (r"mlp\.(gate|up)_proj\.kernel$", (None, "tensor")),
    (r"(attn\.o_proj|mlp\.down_proj)\.kernel$", ("tensor", None)),
    (r"lm_head\.kernel$", (None, "tensor")),
)

# Hugging Face's LlamaForCausalLM checkpoints load onto it: the same names behind "model.", and
# these config fields must equal the hyperparameters (common/twin/hf.py
# checks them, naming every mismatch)
HF = {
    "model_type": "llama",
    "prefix": "model.",
    "config": {
        "vocab_size": "vocab_size",
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
        "num_key_value_heads": "n_kv_heads",
        "intermediate_size": "d_ff",
        "rms_norm_eps": "rms_eps",
        "rope_parameters.rope_theta": "rope_theta",
    },
}

llama_tiny = Twin(
    torch="torch_llama.py:Llama",
    nnx="nnx_llama.py:Llama",
    task="lm",
    hparams=HPARAMS,
    # Hugging Face's name on the torch side, the port's own on the NNX side
    rename={r"\.self_attn\.": ".attn."},
    partition_rules=PARTITION_RULES,
    hf=HF,
    nnx_dtype_arg="dtype",  # the port computes in bfloat16 under --dtype bfloat16
    train=TrainSpec(
        optimizer="adamw",
        lr=3e-3,
        weight_decay=0.1,
        beta2=0.95,
        schedule="warmup_cosine",
        schedule_warmup_steps=5,
        global_batch_size=16,
        steps=30,
    ),
)

llama_tiny_misported = Twin(
    torch="torch_llama.py:Llama",
    nnx="nnx_llama.py:llama_interleaved",
    task="lm",
    hparams=HPARAMS,
    rename={r"\.self_attn\.": ".attn."},
    partition_rules=PARTITION_RULES,
    nnx_dtype_arg="dtype",
    train=llama_tiny.train,
)

# Hugging Face's own LlamaForCausalLM as the torch side, unchanged (hf_llama.py): its names carry
# "model.", and a save_pretrained directory loads as it is (prefix "")
llama_hf = Twin(
    torch="hf_llama.py:llama",
    nnx="nnx_llama.py:Llama",
    task="lm",
    hparams=HPARAMS,
    rename={r"^model\.": "", r"\.self_attn\.": ".attn."},
    partition_rules=PARTITION_RULES,
    hf={**HF, "prefix": ""},
    nnx_dtype_arg="dtype",
    # --generate: the port's own KV cache (nnx_llama.py decode); HF's model brings its own
    decode={"nnx": "nnx_llama.py:decode"},
    train=llama_tiny.train,
)

# a decode-only mis-port: the training step is right, each new token's rotary position is one off
llama_hf_decode_position_off = dataclasses.replace(
    llama_hf, decode={"nnx": "nnx_llama.py:decode_position_off"}
)
# the new tokens attend to the left padding of the shorter prompts (the decode mask ignored)
llama_hf_decode_padding_seen = dataclasses.replace(
    llama_hf, decode={"nnx": "nnx_llama.py:decode_padding_seen"}
)
# the KV cache kept in bfloat16 whatever the run's dtype
llama_hf_decode_cache_bfloat16 = dataclasses.replace(
    llama_hf, decode={"nnx": "nnx_llama.py:decode_cache_bfloat16"}
)

llama_hf_misported = dataclasses.replace(llama_hf, nnx="nnx_llama.py:llama_interleaved", hf={})

# the port holding its rotary frequencies in an NNX Buffer, as the torch model holds its `inv_freq`
# buffer: the start state is compared by name (layers.N.self_attn.inv_freq meets
# layers.N.attn.inv_freq through the rename)
llama_table = dataclasses.replace(llama_tiny, nnx="nnx_llama.py:llama_table")
llama_table_misported = dataclasses.replace(llama_tiny, nnx="nnx_llama.py:llama_table_misported")

# HF's Llama as it ships against a port whose rotary base is one more: float64 with the model's
# float32 casts widened (train.float32_casts=widen, the default) names layers.0.attn
llama_hf_rope_base_off = dataclasses.replace(llama_hf, nnx="nnx_llama.py:llama_rope_base_off")

# the NNX side's Pallas kernels (kernels.py: jax's flash attention, an own fused RMSNorm) against
# Hugging Face's Llama with SDPA: `kernel` is the switch, "reference" on both sides by default, so
# the same twin runs both ways; --jax-set model.kernel=pallas runs the kernels, judged against SDPA
# and by their own noise floor (--torchax-set model.kernel=pallas: torchax calls the same kernel)
llama_kernels = dataclasses.replace(
    llama_hf,
    torch="hf_llama.py:llama_sdpa",
    hparams={**HPARAMS, "kernel": "reference"},
    kernel_arg="kernel",
    decode={},
    train=dataclasses.replace(llama_tiny.train, steps=3),
)
# kernel mis-ports (nnx_llama.py): the kernel's own default scale, a causal mask one key block
# ahead, epsilon outside the root (only float64 resolves it)
llama_kernels_unscaled = dataclasses.replace(llama_kernels, nnx="nnx_llama.py:llama_flash_unscaled")
llama_kernels_block_ahead = dataclasses.replace(
    llama_kernels, nnx="nnx_llama.py:llama_flash_block_ahead"
)
llama_kernels_eps_outside = dataclasses.replace(
    llama_kernels, nnx="nnx_llama.py:llama_rms_eps_outside"
)

"""The Qwen2 example twin: Hugging Face's own `Qwen2ForCausalLM` as the torch side, unchanged
(hf_qwen2.py), and an NNX port that fuses q/k/v into one projection (nnx_qwen2.py). This file
imports no framework.

    python -m compare --twin examples/hf_qwen2/twin.py:qwen2_tiny --backend all
    # a save_pretrained dir
    python -m compare --twin examples/hf_qwen2/twin.py:qwen2_tiny --checkpoint hf:DIR
    # fails at layers.0.attn
    python -m compare --twin examples/hf_qwen2/twin.py:qwen2_rope_base_misported
    # layers.0.input_layernorm
    python -m compare --twin examples/hf_qwen2/twin.py:qwen2_norm_eps_misported
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
    "rms_eps": 1e-6,
    "rope_theta": 1000000.0,
}

# a save_pretrained directory of Qwen2ForCausalLM loads as it is; these
# config fields must equal the hparams
HF = {
    "model_type": "qwen2",
    "prefix": "",
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

qwen2_tiny = Twin(
    torch="hf_qwen2.py:qwen2",
    nnx="nnx_qwen2.py:Qwen2",
    task="lm",
    hparams=HPARAMS,
    rename={r"^model\.": "", r"\.self_attn\.": ".attn."},
    # keyed by the NNX module: its fused kernel's columns are torch's q_proj | k_proj | v_proj rows
    packed={"attn.qkv": ("attn.q_proj", "attn.k_proj", "attn.v_proj")},
    hf=HF,
    nnx_dtype_arg="dtype",  # the port computes in bfloat16 under --dtype bfloat16
    # --generate: the port's own KV cache (nnx_qwen2.py decode); HF's model brings its own
    decode={"nnx": "nnx_qwen2.py:decode"},
    train=TrainSpec(
        optimizer="adamw",
        lr=3e-3,
        weight_decay=0.1,
        beta2=0.95,
        schedule="warmup_cosine",
        schedule_warmup_steps=5,
        global_batch_size=16,
        steps=20,
    ),
)

qwen2_rope_base_misported = dataclasses.replace(
    qwen2_tiny, nnx="nnx_qwen2.py:qwen2_llama_rope_base", hf={}
)
qwen2_norm_eps_misported = dataclasses.replace(
    qwen2_tiny, nnx="nnx_qwen2.py:qwen2_llama_norm_eps", hf={}
)

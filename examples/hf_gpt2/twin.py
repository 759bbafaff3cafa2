"""The GPT-2 example twin: Hugging Face's own `GPT2LMHeadModel` as the torch side, unchanged
(hf_gpt2.py: its `Conv1D` projections hold (in, out) weights), and an NNX port with nn.Linear-style
kernels (nnx_gpt2.py). No layout is declared: the describe step runs each projection once to see how
it uses its weight (torch_impl/orientation.py). This file imports no framework.

    python -m compare --twin examples/hf_gpt2/twin.py:gpt2_tiny --checkpoint hf:DIR
    python -m compare --twin examples/hf_gpt2/twin.py:gpt2_qkv_misported  # fails at h.0.attn
    python -m compare --twin examples/hf_gpt2/twin.py:gpt2_untied  # refused: HF's head is tied
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
    "ln_eps": 1e-5,
}

# a save_pretrained directory of GPT2LMHeadModel loads as it is; these config fields must equal
# the hyperparameters
HF = {
    "model_type": "gpt2",
    "prefix": "",
    "config": {
        "vocab_size": "vocab_size",
        "n_positions": "seq_len",
        "n_embd": "d_model",
        "n_layer": "n_layers",
        "n_head": "n_heads",
        "layer_norm_epsilon": "ln_eps",
    },
}

gpt2_tiny = Twin(
    torch="hf_gpt2.py:gpt2",
    nnx="nnx_gpt2.py:GPT2",
    task="lm",
    hparams=HPARAMS,
    rename={r"^transformer\.": ""},
    hf=HF,
    train=TrainSpec(
        optimizer="adamw",
        lr=3e-3,
        weight_decay=0.1,
        beta2=0.95,
        global_batch_size=16,
        steps=10,
    ),
)

gpt2_qkv_misported = dataclasses.replace(gpt2_tiny, nnx="nnx_gpt2.py:gpt2_qkv_misported")
gpt2_untied = dataclasses.replace(gpt2_tiny, nnx="nnx_gpt2.py:gpt2_untied")

# separate q, k and v projections against HF's packed Conv1D `c_attn` (in, 3 * out): packed along
# the axis its outputs lie on, which the probe of its orientation decides (common/twin/links.py)
gpt2_split_qkv = dataclasses.replace(
    gpt2_tiny,
    nnx="nnx_gpt2.py:gpt2_split_qkv",
    packed={"attn.c_attn": ("attn.q", "attn.k", "attn.v")},
)

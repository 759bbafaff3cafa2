"""The Gemma 2 example twin: Hugging Face's own `Gemma2ForCausalLM` as the torch side, unchanged
(hf_gemma2.py), and an NNX port with Google's names and its own embedder (nnx_gemma2.py). This
file imports no framework.

    python -m compare --twin examples/gemma2/twin.py:gemma2_tiny --activations
    python -m compare --twin examples/gemma2/twin.py:gemma2_norm_times_w  # at the first norm
    python -m compare --twin examples/gemma2/twin.py:gemma2_scaled_by_head_dim  # at layers.0.attn
    python -m compare --twin examples/gemma2/twin.py:gemma2_window_off_by_one  # at layers.0.attn
    python -m compare --twin examples/gemma2/twin.py:gemma2_no_final_softcap  # at the model
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
    "head_dim": 16,
    "d_ff": 128,
    "rms_eps": 1e-6,
    "rope_theta": 10000.0,
    "query_pre_attn_scalar": 24,  # not head_dim: a port that scales by head_dim differs
    "sliding_window": 8,  # shorter than the sequence: the window counts
    "attn_softcap": 50.0,
    "final_softcap": 30.0,
}

gemma2_tiny = Twin(
    torch="hf_gemma2.py:gemma2",
    nnx="nnx_gemma2.py:Gemma2",
    task="lm",
    hparams=HPARAMS,
    # Hugging Face's names on the torch side, Google's on the NNX side
    rename={
        r"^model\.embed_tokens\.": "embedder.",
        r"^model\.norm\.": "final_norm.",
        r"^model\.": "",
        r"\.self_attn\.": ".attn.",
    },
    nnx_dtype_arg="dtype",  # its compute dtype (bfloat16 runs)
    # --generate: the port's own KV cache (nnx_gemma2.py decode); HF's model brings its own
    decode={"nnx": "nnx_gemma2.py:decode"},
    train=TrainSpec(
        optimizer="adamw",
        lr=3e-3,
        weight_decay=0.1,
        beta2=0.95,
        global_batch_size=8,
        steps=10,
    ),
)

# a decode-only mis-port: the new tokens attend to the whole cache on the sliding-window layers
gemma2_decode_window_not_over_cache = dataclasses.replace(
    gemma2_tiny, decode={"nnx": "nnx_gemma2.py:decode_window_not_over_cache"}
)
gemma2_norm_times_w = dataclasses.replace(gemma2_tiny, nnx="nnx_gemma2.py:gemma2_norm_times_w")
gemma2_scaled_by_head_dim = dataclasses.replace(
    gemma2_tiny, nnx="nnx_gemma2.py:gemma2_scaled_by_head_dim"
)
gemma2_window_off_by_one = dataclasses.replace(
    gemma2_tiny, nnx="nnx_gemma2.py:gemma2_window_off_by_one"
)
gemma2_no_final_softcap = dataclasses.replace(
    gemma2_tiny, nnx="nnx_gemma2.py:gemma2_no_final_softcap"
)

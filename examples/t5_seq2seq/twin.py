"""The T5 example twin, an encoder-decoder trained with teacher forcing: Hugging Face's own
`T5ForConditionalGeneration`, unchanged, against an NNX port with its own module names (a relative
position bias owned by each stack, as T5X keeps it), on padded sources and -100-padded targets from
a numpy batch function, each side computing its own loss from `labels`.

    python -m compare --twin examples/t5_seq2seq/twin.py:t5_tiny --backend all
    # scores / sqrt(d_kv): T5 has none
    python -m compare --twin examples/t5_seq2seq/twin.py:t5_scaled_attention
"""

import dataclasses

from common.spec import DataSpec, TrainSpec
from common.twin import Twin

t5_tiny = Twin(
    torch="hf_t5.py:t5",
    nnx="nnx_t5.py:T5",
    task="custom",
    hparams={
        "vocab_size": 96,
        "d_model": 32,
        "d_kv": 8,
        "d_ff": 64,
        "n_layers": 2,
        "n_heads": 4,
        "rel_buckets": 32,
        "rel_max_distance": 128,
    },
    data=DataSpec(dataset="batches", path="batches.py:reverse_batch"),
    loss="model",  # both forwards shift the labels into the decoder and compute the loss from them
    ranges={
        "input_ids": (0, "vocab_size"),
        "attention_mask": (0, 2),
        "labels": (-100, "vocab_size"),
    },
    rename={
        r"^shared\.": "embed.",
        r"^(en|de)coder\.block\.0\.layer\.0\.SelfAttention\.relative_attention_bias\.": (
            r"\1coder.rel_bias."
        ),
        r"^encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.": r"encoder.layers.\1.attn.",
        r"^encoder\.block\.(\d+)\.layer\.0\.layer_norm\.": r"encoder.layers.\1.norm1.",
        r"^encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.": r"encoder.layers.\1.mlp.",
        r"^encoder\.block\.(\d+)\.layer\.1\.layer_norm\.": r"encoder.layers.\1.norm2.",
        r"^decoder\.block\.(\d+)\.layer\.0\.SelfAttention\.": r"decoder.layers.\1.self_attn.",
        r"^decoder\.block\.(\d+)\.layer\.0\.layer_norm\.": r"decoder.layers.\1.norm1.",
        r"^decoder\.block\.(\d+)\.layer\.1\.EncDecAttention\.": r"decoder.layers.\1.cross_attn.",
        r"^decoder\.block\.(\d+)\.layer\.1\.layer_norm\.": r"decoder.layers.\1.norm2.",
        r"^decoder\.block\.(\d+)\.layer\.2\.DenseReluDense\.": r"decoder.layers.\1.mlp.",
        r"^decoder\.block\.(\d+)\.layer\.2\.layer_norm\.": r"decoder.layers.\1.norm3.",
        r"\.mlp\.wi_0\.": ".mlp.gate.",
        r"\.mlp\.wi_1\.": ".mlp.up.",
        r"\.mlp\.wo\.": ".mlp.down.",
        r"\.final_layer_norm\.": ".final_norm.",
        # modules holding no parameter of their own: each block is the port's layer, the stacks'
        # token table
        r"^(en|de)coder\.block\.(\d+)\.": r"\1coder.layers.\2.",
        r"^(en|de)coder\.embed_tokens\.": "embed.",
    },
    nnx_dtype_arg="dtype",
    train=TrainSpec(optimizer="adamw", lr=3e-3, weight_decay=0.01, global_batch_size=8, steps=6),
)

t5_scaled_attention = dataclasses.replace(t5_tiny, nnx="nnx_t5.py:t5_scaled_attention")
t5_bidirectional_decoder_buckets = dataclasses.replace(
    t5_tiny, nnx="nnx_t5.py:t5_bidirectional_decoder_buckets"
)

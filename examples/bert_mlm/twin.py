"""The BERT masked-LM example twin: Hugging Face's own `BertForMaskedLM`, unchanged, against an NNX
port with its own module names, on padded sentence pairs (attention mask, token types) made by a
numpy batch function, each side computing its own loss from `labels`.

    python -m compare --twin examples/bert_mlm/twin.py:bert_tiny --backend all
    # attends to padding: fails at layers.0
    python -m compare --twin examples/bert_mlm/twin.py:bert_mask_ignored
    # fails at layers.0
    python -m compare --twin examples/bert_mlm/twin.py:bert_tanh_gelu --dtype float64

(The attention's math lies between its projections, in no module of its own on either side: the
first module whose input agrees and output does not is the layer. nnx_bert.py's tanh-GELU mis-port
passes from this start in float32: at Hugging Face's initialisation, std 0.02, the GELU's inputs are
too small for tanh and erf to differ, 1.2e-7; float64 finds it, docs/findings.md.)
"""

import dataclasses

from common.spec import DataSpec, TrainSpec
from common.twin import Twin

bert_tiny = Twin(
    torch="hf_bert.py:bert",
    nnx="nnx_bert.py:Bert",
    task="custom",
    hparams={
        "vocab_size": 128,
        "seq_len": 32,
        "d_model": 64,
        "n_layers": 2,
        "n_heads": 4,
        "d_ff": 128,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
    },
    data=DataSpec(dataset="batches", path="batches.py:mlm_batch"),
    loss="model",  # both forwards compute the masked-LM loss from `labels`
    ranges={
        "input_ids": (0, "vocab_size"),
        "token_type_ids": (0, "type_vocab_size"),
        "attention_mask": (0, 2),
        "labels": (-100, "vocab_size"),
    },
    rename={
        r"^bert\.embeddings\.word_embeddings\.": "embed.tok.",
        r"^bert\.embeddings\.position_embeddings\.": "embed.pos.",
        r"^bert\.embeddings\.token_type_embeddings\.": "embed.type.",
        r"^bert\.embeddings\.LayerNorm\.": "embed.ln.",
        r"^bert\.encoder\.layer\.": "layers.",
        r"\.attention\.self\.query\.": ".attn.q.",
        r"\.attention\.self\.key\.": ".attn.k.",
        r"\.attention\.self\.value\.": ".attn.v.",
        r"\.attention\.output\.dense\.": ".attn.o.",
        r"\.attention\.output\.LayerNorm\.": ".ln1.",
        r"\.intermediate\.dense\.": ".mlp.up.",
        r"\.output\.dense\.": ".mlp.down.",
        r"\.output\.LayerNorm\.": ".ln2.",
        r"^cls\.predictions\.transform\.dense\.": "head.dense.",
        r"^cls\.predictions\.transform\.LayerNorm\.": "head.ln.",
        r"^cls\.predictions\.bias$": "head.bias",
    },
    nnx_dtype_arg="dtype",
    train=TrainSpec(optimizer="adamw", lr=1e-3, weight_decay=0.01, global_batch_size=8, steps=6),
)

bert_mask_ignored = dataclasses.replace(bert_tiny, nnx="nnx_bert.py:bert_mask_ignored")
bert_tanh_gelu = dataclasses.replace(bert_tiny, nnx="nnx_bert.py:bert_tanh_gelu")

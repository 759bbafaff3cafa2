"""The CLIP example twin: Hugging Face's own `CLIPModel` as the torch side, unchanged (hf_clip.py),
and an NNX port with its own names whose towers return their pooled vectors alone (nnx_clip.py),
trained on image-caption batches of its own (batches.py) with its own contrastive loss (losses.py).
This file imports no framework.

    python -m compare --twin examples/clip/twin.py:clip_tiny --backend jax,torch
    # in the loss
    python -m compare --twin examples/clip/twin.py:clip_one_directional_loss --backend jax,torch
    # fails
    python -m compare --twin examples/clip/twin.py:clip_text_not_normalised --backend jax,torch
    # fails
    python -m compare --twin examples/clip/twin.py:clip_pooled_first --backend jax,torch
    # in the loss
    python -m compare --twin examples/clip/twin.py:clip_own_loss_one_directional --backend jax,torch
"""

import dataclasses

from common.spec import DataSpec, TrainSpec
from common.twin import Twin

clip_tiny = Twin(
    torch="hf_clip.py:clip",
    nnx="nnx_clip.py:CLIP",
    task="custom",
    hparams={
        "vocab_size": 64,
        "seq_len": 16,
        "image_size": 16,
        "patch_size": 8,
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 2,
        "d_ff": 64,
        "embed_dim": 24,
    },
    data=DataSpec(dataset="batches", path="batches.py:image_caption_batch"),
    loss={"torch": "losses.py:torch_clip_loss", "nnx": "losses.py:nnx_clip_loss"},
    logits="logits_per_image",
    ranges={"input_ids": (0, "vocab_size"), "attention_mask": (0, 2)},
    nnx_input_axes={"pixel_values": (0, 2, 3, 1)},  # NCHW images to the NHWC port
    rename={
        r"^text_model\.embeddings\.": "text.",
        r"^text_model\.encoder\.layers\.": "text.layers.",
        r"^text_model\.final_layer_norm": "text.final_norm",
        r"^text_model": "text",
        r"^vision_model\.embeddings\.patch_embedding": "vision.patch",
        r"^vision_model\.embeddings\.": "vision.",
        r"^vision_model\.encoder\.layers\.": "vision.layers.",
        r"^vision_model\.pre_layrnorm": "vision.pre_norm",
        r"^vision_model\.post_layernorm": "vision.post_norm",
        r"^vision_model": "vision",
        r"\.self_attn\.": ".attn.",
        r"\.mlp\.fc": ".fc",
    },
    train=TrainSpec(optimizer="adamw", lr=1e-3, weight_decay=0.01, global_batch_size=8, steps=6),
)

clip_one_directional_loss = dataclasses.replace(
    clip_tiny, loss={"torch": "losses.py:torch_clip_loss", "nnx": "losses.py:nnx_one_directional"}
)
clip_text_not_normalised = dataclasses.replace(
    clip_tiny, nnx="nnx_clip.py:clip_text_not_normalised"
)
clip_pooled_first = dataclasses.replace(clip_tiny, nnx="nnx_clip.py:clip_pooled_first")

# CLIPModel's own loss (forward(..., return_loss=True): its `loss`), the port computing it in its
# forward alike
clip_own_loss = dataclasses.replace(clip_tiny, loss="model", forward_kwargs={"return_loss": True})
clip_own_loss_one_directional = dataclasses.replace(
    clip_own_loss, nnx="nnx_clip.py:clip_loss_one_directional"
)

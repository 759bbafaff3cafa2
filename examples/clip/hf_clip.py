"""Hugging Face's own `CLIPModel`, used as it is for the torch side: built from a `CLIPConfig` of
the twin's hyperparameters (no download). Two towers: a text transformer pooled at each sequence's
first EOS token and a ViT pooled at its class token, each projected and L2-normalised; the
image-text logits scaled by `exp(logit_scale)`, a 0-d parameter. Its towers return
`BaseModelOutputWithPooling` (the hidden states first, the pooled vector second) and the model a
`CLIPOutput`; the twin's own contrastive loss reads `logits_per_image` (losses.py)."""

from __future__ import annotations

from transformers import CLIPConfig, CLIPModel


def clip(
    vocab_size: int,
    seq_len: int,
    image_size: int,
    patch_size: int,
    d_model: int,
    n_layers: int,
    n_heads: int,
    d_ff: int,
    embed_dim: int,
) -> CLIPModel:
    tower = {
        "hidden_size": d_model,
        "intermediate_size": d_ff,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "hidden_act": "quick_gelu",
    }
    config = CLIPConfig(
        text_config={
            **tower,
            "vocab_size": vocab_size,
            "max_position_embeddings": seq_len,
            "eos_token_id": vocab_size - 1,
            "bos_token_id": vocab_size - 2,
            "pad_token_id": 0,
        },
        vision_config={**tower, "image_size": image_size, "patch_size": patch_size},
        projection_dim=embed_dim,
    )
    config.text_config._attn_implementation = config.vision_config._attn_implementation = "eager"
    return CLIPModel(config)

"""Torch side: Hugging Face's Wav2Vec2ForSequenceClassification, unchanged, built from a tiny
config."""

from transformers import Wav2Vec2Config, Wav2Vec2ForSequenceClassification


def wav2vec2_cls(
    input_shape,
    num_classes,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    intermediate_size=64,
    conv_dim=(16, 16),
    conv_kernel=(10, 3),
    conv_stride=(5, 2),
    pos_kernel=16,
    pos_groups=4,
    proj_size=16,
):
    cfg = Wav2Vec2Config(
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=intermediate_size,
        conv_dim=tuple(conv_dim),
        conv_kernel=tuple(conv_kernel),
        conv_stride=tuple(conv_stride),
        num_conv_pos_embeddings=pos_kernel,
        num_conv_pos_embedding_groups=pos_groups,
        num_labels=num_classes,
        classifier_proj_size=proj_size,
        feat_extract_norm="group",
        do_stable_layer_norm=False,
        hidden_dropout=0.0,
        activation_dropout=0.0,
        attention_dropout=0.0,
        feat_proj_dropout=0.0,
        final_dropout=0.0,
        layerdrop=0.0,
        mask_time_prob=0.0,
        mask_feature_prob=0.0,
    )
    return Wav2Vec2ForSequenceClassification(cfg)

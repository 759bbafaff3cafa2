"""Hugging Face's Wav2Vec2ForSequenceClassification, unchanged (its feature encoder sets
requires_grad on its input; its positional convolution is weight-normed), against a new user's NNX
port with its own names, fed raw audio. `w2v_inner_conv` is that user's first rename: HF's inner
Conv1d (its output before the trim) on the port's pos_conv, a module boundary the two sides draw
apart."""

from common.twin import Twin

HP = {"input_shape": (400,), "num_classes": 4}

RENAME = {
    r"^wav2vec2\.": "",
    r"^feature_extractor\.conv_layers\.": "feature_encoder.convs.",
    r"^feature_extractor\.$": "feature_encoder.",
    r"^(feature_encoder\.convs\.\d+\.)layer_norm\.": r"\1norm.",
    r"^feature_projection\.layer_norm\.": "feature_proj.norm.",
    r"^feature_projection\.projection\.": "feature_proj.dense.",
    r"^encoder\.pos_conv_embed\.conv\.parametrizations\.weight\.original0$": "encoder.pos_conv.g",
    r"^encoder\.pos_conv_embed\.conv\.parametrizations\.weight\.original1$": "encoder.pos_conv.v",
    r"^encoder\.pos_conv_embed\.conv\.bias$": "encoder.pos_conv.bias",
    # module paths: HF's whole Wav2Vec2PositionalConvEmbedding (conv + SamePad + GELU) is my
    # pos_conv; its inner Conv1d (untrimmed output) maps to no NNX module
    r"^encoder\.pos_conv_embed\.$": "encoder.pos_conv.",
    r"^encoder\.layer_norm\.": "encoder.norm.",
    r"\.attention\.q_proj\.": ".attn.query.",
    r"\.attention\.k_proj\.": ".attn.key.",
    r"\.attention\.v_proj\.": ".attn.value.",
    r"\.attention\.out_proj\.": ".attn.out.",
    r"\.attention\.": ".attn.",
    r"(\.layers\.\d+\.)layer_norm\.": r"\1attn_norm.",
    r"\.feed_forward\.intermediate_dense\.": ".mlp.fc1.",
    r"\.feed_forward\.output_dense\.": ".mlp.fc2.",
    r"\.feed_forward\.": ".mlp.",
    r"\.final_layer_norm\.": ".mlp_norm.",
    r"^projector\.": "head.proj.",
    r"^classifier\.": "head.out.",
}

LAYOUTS = {
    r"encoder\.pos_conv\.v$": "o i k -> k i o",
    r"encoder\.pos_conv\.g$": "1 1 k -> k",
}


def _twin(nnx_factory, rename=RENAME):
    return Twin(
        torch="models_torch.py:wav2vec2_cls",
        nnx=f"models_nnx.py:{nnx_factory}",
        task="classification",
        hparams=dict(HP),
        rename=dict(rename),
        layouts=dict(LAYOUTS),
    )


w2v = _twin("wav2vec2_cls")
w2v_inner_conv = _twin(
    "wav2vec2_cls", {**RENAME, r"^encoder\.pos_conv_embed\.conv\.": "encoder.pos_conv."}
)

# deliberate mis-ports, one per twin
misport_tanh_gelu = _twin("misport_tanh_gelu")  # (a) tanh GELU in the feed-forward
misport_wn_axis = _twin("misport_wn_axis")  # (b) weight norm over the wrong axes
misport_groupnorm = _twin("misport_groupnorm")  # (c) GroupNorm with 1 group instead of 16
misport_samepad = _twin("misport_samepad")  # (d) SamePad trims the first step, not the last
misport_gn_eps = _twin("misport_gn_eps")  # (c2) GroupNorm eps 1e-6 (Flax default)

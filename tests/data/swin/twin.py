"""torchvision's Swin Transformer (channel-last inside, torch.roll's shifted windows, a relative
position bias table and index, attention that reads its Linear layers' weights with F.linear)
against an NHWC NNX port with its own names (a new user's: stages[i].blocks[j], patch merging inside
each stage, the bias table held as (heads, window, window)): the rename and layout that user
wrote."""

from common.twin import Twin

RENAME = {
    r"^features\.0\.0\.": "patch_embed.proj.",
    r"^features\.0\.2\.": "patch_embed.norm.",
    r"^features\.0\.$": "patch_embed.",
    r"^features\.1\.": "stages.0.blocks.",
    r"^features\.2\.": "stages.0.downsample.",
    r"^features\.3\.": "stages.1.blocks.",
    r"\.mlp\.0\.": ".mlp.fc1.",
    r"\.mlp\.3\.": ".mlp.fc2.",
    r"\.relative_position_bias_table$": ".rel_bias",
}
COMMON = dict(
    task="classification",
    rename=RENAME,
    layouts={r"attn\.rel_bias$": "(a b) h -> h a b"},
    hparams={
        "input_shape": (3, 32, 32),
        "num_classes": 10,
        "patch": 4,
        "embed_dim": 16,
        "depths": (2, 2),
        "heads": (2, 4),
        "window": 4,
    },
    nnx_input_axes=(0, 2, 3, 1),
)

swin = Twin(torch="models_torch.py:swin_tiny", nnx="models_nnx.py:SwinTiny", **COMMON)
swin_ln_eps_misported = Twin(
    torch="models_torch.py:swin_tiny", nnx="models_nnx.py:swin_ln_eps_misported", **COMMON
)

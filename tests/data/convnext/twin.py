"""torchvision's ConvNeXt (its index-named Sequentials, LayerNorm2d, a (dim, 1, 1) layer scale)
against an NHWC NNX port with its own names: the rename a new user wrote, containers included, and
the layer scale's layout."""

from common.spec import TrainSpec
from common.twin import Twin

RENAME = {
    r"^features\.0\.0\.": "stem_conv.",
    r"^features\.0\.1\.": "stem_norm.",
    r"^features\.1\.": "stages.0.",
    r"^features\.2\.$": "downsamples.0.",  # the container (a module path ends in '.')
    r"^features\.2\.0\.": "downsamples.0.norm.",
    r"^features\.2\.1\.": "downsamples.0.conv.",
    r"^features\.3\.": "stages.1.",
    r"\.block\.0\.": ".dwconv.",
    r"\.block\.2\.": ".norm.",
    r"\.block\.3\.": ".pwconv1.",
    r"\.block\.5\.": ".pwconv2.",
    r"\.layer_scale$": ".gamma",
    r"^classifier\.0\.": "norm.",
    r"^classifier\.2\.": "head.",
}
COMMON = dict(
    task="classification",
    rename=RENAME,
    layouts={r"\.gamma$": "d 1 1 -> d"},
    hparams={
        "input_shape": (3, 32, 32),
        "num_classes": 10,
        "dims": (16, 32),
        "depths": (1, 1),
        "layer_scale": 0.1,
    },
    nnx_input_axes=(0, 2, 3, 1),
    train=TrainSpec(optimizer="adamw", lr=1e-3, global_batch_size=8, steps=2),
)

convnext = Twin(torch="models_torch.py:ConvNeXt", nnx="models_nnx.py:ConvNeXt", **COMMON)
convnext_block_eps_misported = Twin(
    torch="models_torch.py:ConvNeXt", nnx="models_nnx.py:convnext_block_eps_misported", **COMMON
)
convnext_tanh_gelu = Twin(
    torch="models_torch.py:ConvNeXt", nnx="models_nnx.py:convnext_tanh_gelu", **COMMON
)

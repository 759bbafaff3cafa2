"""The ViT example twin: torchvision's way on the torch side (nn.MultiheadAttention), an NHWC NNX
port with nnx.MultiHeadAttention on the other. The attention needs no declaration; three renames say
where the port names modules its own way (torchvision's `encoder_layer_N`, the MLP's dropout-shifted
index, `heads.head`).

    python -m compare --twin examples/vit/twin.py:vit_tiny --backend all
    # fails at encoder.layers.0.mlp
    python -m compare --twin examples/vit/twin.py:vit_tiny_tanh_gelu
"""

import dataclasses

from common.spec import TrainSpec
from common.twin import Twin

HPARAMS = {
    "input_shape": (3, 16, 16),
    "num_classes": 10,
    "patch_size": 4,
    "num_layers": 2,
    "num_heads": 4,
    "hidden_dim": 32,
    "mlp_dim": 64,
}
RENAME = {r"\.encoder_layer_(\d+)\.": r".\1.", r"\.mlp\.3\.": ".mlp.2.", r"^heads\.head\.": "head."}

vit_tiny = Twin(
    torch="torch_vit.py:vit",
    nnx="nnx_vit.py:vit",
    task="classification",
    hparams=HPARAMS,
    rename=RENAME,
    nnx_input_axes=(0, 2, 3, 1),
    train=TrainSpec(optimizer="adamw", lr=1e-3, weight_decay=0.05, global_batch_size=16, steps=8),
)

vit_tiny_tanh_gelu = dataclasses.replace(vit_tiny, nnx="nnx_vit.py:vit_tanh_gelu")

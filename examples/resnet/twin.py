"""The ResNet example twin: torchvision's way on the torch side, an NHWC NNX port on the other.

    python -m compare --twin examples/resnet/twin.py:resnet_tiny --backend all
    # fails at layer2.0.conv1
    python -m compare --twin examples/resnet/twin.py:resnet_tiny_same_padding
    # trains alike, evaluates apart
    python -m compare --twin examples/resnet/twin.py:resnet_tiny_bn_momentum

16 channels on 16x16 images: the stem's and layer1's activations have the same shape in NCHW and
NHWC, so only their known layouts set them side by side (common/capture/activations.py).
"""

import dataclasses

from common.spec import TrainSpec
from common.twin import Twin

HPARAMS = {
    "input_shape": (3, 16, 16),
    "num_classes": 10,
    "layers": (1, 1, 1),
    "widths": (16, 32, 64),
}

resnet_tiny = Twin(
    torch="torch_resnet.py:resnet",
    nnx="nnx_resnet.py:resnet",
    task="classification",
    hparams=HPARAMS,
    nnx_input_axes=(0, 2, 3, 1),  # the task's NCHW images, fed to the NHWC port as NHWC
    train=TrainSpec(
        optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4, global_batch_size=16, steps=8
    ),
)

resnet_tiny_same_padding = dataclasses.replace(resnet_tiny, nnx="nnx_resnet.py:resnet_same_padding")

resnet_tiny_bn_momentum = dataclasses.replace(
    resnet_tiny, nnx="nnx_resnet.py:resnet_torch_momentum"
)

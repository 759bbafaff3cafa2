from common.spec import TrainSpec
from common.twin import Twin

HPARAMS = {"input_shape": (3, 8, 8), "width": 8, "num_classes": 4}
TRAIN = TrainSpec(optimizer="adamw", lr=1e-3, global_batch_size=8, steps=3)

upsampler = Twin(
    torch="models.py:TorchUpsampler",
    nnx="models.py:NnxUpsampler",
    task="classification",
    hparams=HPARAMS,
    train=TRAIN,
    nnx_input_axes=(0, 2, 3, 1),
)
upsampler_torch_padding = Twin(
    torch="models.py:TorchUpsampler",
    nnx="models.py:nnx_upsampler_torch_padding",
    task="classification",
    hparams=HPARAMS,
    train=TRAIN,
    nnx_input_axes=(0, 2, 3, 1),
)
# the NHWC port without the transpose its inputs need: describing it, compare
# refuses it naming the declaration
upsampler_fed_nchw = Twin(
    torch="models.py:TorchUpsampler",
    nnx="models.py:NnxUpsampler",
    task="classification",
    hparams=HPARAMS,
    train=TRAIN,
)

import dataclasses

from common.spec import TrainSpec
from common.twin import Twin

scaled = Twin(
    torch="models.py:TorchScaled",
    nnx="models.py:NnxScaled",
    task="classification",
    hparams={"features": 8, "num_classes": 4, "input_shape": (8,)},
    train=TrainSpec(global_batch_size=8, steps=3),
)
scaled_misported = dataclasses.replace(scaled, nnx="models.py:NnxScaledMisported")

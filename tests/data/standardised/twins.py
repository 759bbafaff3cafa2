import dataclasses

from common.spec import TrainSpec
from common.twin import Twin

standardised = Twin(
    torch="models.py:TorchStandardised",
    nnx="models.py:NnxStandardised",
    task="classification",
    hparams={"features": 8, "hidden": 16, "num_classes": 4, "input_shape": (8,)},
    train=TrainSpec(global_batch_size=8, steps=3),
)
standardised_misported = dataclasses.replace(standardised, nnx="models.py:NnxStandardisedMisported")
running = dataclasses.replace(
    standardised, torch="models.py:TorchRunningStandardised", nnx="models.py:NnxRunningStandardised"
)
running_misported = dataclasses.replace(running, nnx="models.py:NnxRunningStandardisedMisported")

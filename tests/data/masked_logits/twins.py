from common.spec import TrainSpec
from common.twin import Twin

masked = Twin(
    torch="models.py:TorchNet",
    nnx="models.py:NnxNet",
    task="classification",
    hparams={"input_shape": 20, "hidden": 32, "num_classes": 5},
    train=TrainSpec(optimizer="adamw", lr=1e-3, global_batch_size=16, steps=2),
)

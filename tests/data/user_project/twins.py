from common.spec import TrainSpec
from common.twin import Twin

HPARAMS = {"input_shape": 20, "hidden": 32, "num_classes": 5}
TRAIN = TrainSpec(optimizer="adamw", lr=1e-3, global_batch_size=16, steps=4)

net = Twin(
    torch="models.py:TorchNet",
    nnx="models.py:NnxNet",
    task="classification",
    hparams=HPARAMS,
    train=TRAIN,
)
net_misported = Twin(
    torch="models.py:TorchNet",
    nnx="models.py:nnx_net_misported",
    task="classification",
    hparams=HPARAMS,
    train=TRAIN,
)
net_renamed = Twin(
    torch="models.py:TorchNet",
    nnx="models.py:nnx_net_renamed",
    task="classification",
    hparams=HPARAMS,
    train=TRAIN,
)
torch_raises = Twin(
    torch="models.py:raises",
    nnx="models.py:NnxNet",
    task="classification",
    hparams=HPARAMS,
    train=TRAIN,
)
nnx_not_a_module = Twin(
    torch="models.py:TorchNet",
    nnx="models.py:not_a_module",
    task="classification",
    hparams=HPARAMS,
    train=TRAIN,
)
small_batches = Twin(
    torch="models.py:TorchNetSmallBatches",
    nnx="models.py:NnxNetSmallBatches",
    task="classification",
    hparams=HPARAMS,
    train=TRAIN,
)
model_outputs = Twin(
    torch="models.py:TorchModelOutput",
    nnx="models.py:NnxLogitsAndHidden",
    task="classification",
    hparams=HPARAMS,
    train=TRAIN,
)
torch_scores = Twin(
    torch="models.py:TorchScores",
    nnx="models.py:NnxNet",
    task="classification",
    hparams=HPARAMS,
    train=TRAIN,
    logits="scores",
)
reads_value = Twin(
    torch="models.py:TorchReadsValue",
    nnx="models.py:NnxNet",
    task="classification",
    hparams=HPARAMS,
    train=TRAIN,
)
custom_backward = Twin(
    torch="models.py:TorchNetCustomBackward",
    nnx="models.py:NnxNet",
    task="classification",
    hparams=HPARAMS,
    train=TRAIN,
)
backward_misported = Twin(
    torch="models.py:torch_net_backward_misported",
    nnx="models.py:NnxNet",
    task="classification",
    hparams=HPARAMS,
    train=TRAIN,
)
fixes_float32_later = Twin(
    torch="models.py:TorchNetFixesFloat32Later",
    nnx="models.py:NnxNet",
    task="classification",
    hparams=HPARAMS,
    train=TRAIN,
)
fixes_float32 = Twin(
    torch="models.py:TorchNetFixesFloat32",
    nnx="models.py:NnxNet",
    task="classification",
    hparams=HPARAMS,
    train=TRAIN,
)

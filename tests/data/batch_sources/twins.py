import dataclasses

from common.spec import DataSpec, TrainSpec
from common.twin import Twin

good = Twin(
    torch="models.py:TorchNet",
    nnx="models.py:NnxNet",
    task="custom",
    hparams={"features": 8, "conditions": 4},
    data=DataSpec(dataset="batches", path="batches.py:good"),
    loss={"torch": "models.py:torch_loss", "nnx": "models.py:nnx_loss"},
    loss_keys=("target",),
    ranges={"c": (0, "conditions")},
    train=TrainSpec(optimizer="sgd", lr=0.1, global_batch_size=8, steps=4),
)
shape_changes, nonfinite, out_of_range, extra_key, ignores_seed, float_ids = (
    dataclasses.replace(good, data=DataSpec(dataset="batches", path=f"batches.py:{name}"))
    for name in (
        "shape_changes",
        "nonfinite",
        "out_of_range",
        "extra_key",
        "ignores_seed",
        "float_ids",
    )
)
raises_at_step_3 = dataclasses.replace(
    good, data=DataSpec(dataset="batches", path="batches.py:raises_at_step_3")
)
exits_at_step_2 = dataclasses.replace(
    good, data=DataSpec(dataset="batches", path="batches.py:exits_at_step_2")
)
beyond_int32 = dataclasses.replace(
    good,
    data=DataSpec(dataset="batches", path="batches.py:beyond_int32"),
    loss_keys=("target", "ids"),
)
loss_key_missing = dataclasses.replace(good, loss_keys=("target", "noise"))
# own losses that cannot be trained on, each found by the describe step of its side
loss_per_element = dataclasses.replace(
    good,
    loss={"torch": "models.py:torch_loss_per_element", "nnx": "models.py:nnx_loss_per_element"},
)
loss_int_nnx = dataclasses.replace(
    good, loss={"torch": "models.py:torch_loss", "nnx": "models.py:nnx_loss_int"}
)
loss_int_torch = dataclasses.replace(
    good, loss={"torch": "models.py:torch_loss_int", "nnx": "models.py:nnx_loss"}
)
loss_python_number = dataclasses.replace(
    good, loss={"torch": "models.py:loss_python_number", "nnx": "models.py:nnx_loss"}
)
loss_model_without_one = dataclasses.replace(good, loss="model")
two_outputs = dataclasses.replace(
    good,
    torch="models.py:TorchTwoOutputs",
    nnx="models.py:NnxTwoOutputs",
    loss={"torch": "models.py:torch_logits_loss", "nnx": "models.py:nnx_logits_loss"},
)
two_outputs_misported = dataclasses.replace(two_outputs, nnx="models.py:NnxTwoOutputsMisported")

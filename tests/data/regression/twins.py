"""A regression twin with its own loss per framework (tests/test_tasks.py).

python -m compare --twin tests/data/regression/twins.py:regressor --backend all
python -m compare --twin tests/data/regression/twins.py:regressor_mse          # the task's own
loss python -m compare --twin tests/data/regression/twins.py:regressor_huber_misported   # fails
on the loss
"""

import dataclasses

from common.spec import TrainSpec
from common.twin import Twin

regressor = Twin(
    torch="torch_regressor.py:Regressor",
    nnx="nnx_regressor.py:Regressor",
    task="regression",
    hparams={"input_shape": 12, "hidden": 32, "num_outputs": 3},
    rename={
        r"^body\.0\.": "fc1.",
        r"^body\.1\.": "norm.",
        r"^body\.3\.": "fc2.",
        r"^head\.": "out.",
    },
    loss={"torch": "torch_regressor.py:smooth_l1", "nnx": "nnx_regressor.py:smooth_l1"},
    train=TrainSpec(optimizer="adamw", lr=3e-3, global_batch_size=16, steps=6),
)

regressor_mse = dataclasses.replace(regressor, loss={})
regressor_huber_misported = dataclasses.replace(
    regressor,
    loss={"torch": "torch_regressor.py:smooth_l1", "nnx": "nnx_regressor.py:huber_as_smooth_l1"},
)

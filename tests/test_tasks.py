"""Tasks beyond the built-in two: a regression twin (tests/data/regression) trained with the task's
mean squared error or with a loss written once per framework (the twin's `loss`), a loss mis-port
located at the loss, and the checks of regression data."""

import dataclasses
import json

import numpy as np
import pytest

from common.data import DataError, make_dataset
from common.files.record import read_record
from common.spec import DataSpec, RunSpec, TrainSpec, TwinSpec
from common.spec.parse import run_spec_from_dict
from common.twin import Twin
from common.twin.fields import TwinError, check_fields
from tests.helpers import run_cli

TWINS = "tests/data/regression/twins.py"
BETA = 0.5  # torch_regressor.BETA


def compare(out, twin: str, backends: str, *args):
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(out),
        "--twin",
        f"{TWINS}:{twin}",
        "--backend",
        backends,
        *args,
    )
    report = (
        json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else None
    )
    return proc, report


def step0(run) -> tuple[np.ndarray, np.ndarray, float]:
    """A backend's step-0 predictions (its parity tensors), the targets of step 0's batch (made
    again from the spec it ran) and the loss it recorded at step 0."""
    spec = run_spec_from_dict(json.loads((run / "spec.json").read_text()))
    with np.load(run / "tensors.npz") as f:
        predictions = f["outputs/logits"].astype(np.float64)
    return (
        predictions,
        make_dataset(spec).global_batch(0).targets.astype(np.float64),
        read_record(run).losses[0],
    )


def smooth_l1(predictions, targets):
    error = np.abs(predictions - targets)
    return float(np.mean(np.where(error < BETA, 0.5 * error**2 / BETA, error - 0.5 * BETA)))


@pytest.mark.slow
def test_a_regression_twin_trains_on_its_own_loss_per_framework(tmp_path):
    # torch_xla runs a twin's own loss in tests/test_example_unet.py and tests/test_example_bert.py
    proc, report = compare(tmp_path / "run", "regressor", "jax,torch,torchax")
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = {name: backend["losses"] for name, backend in report["backends"].items()}
    assert set(losses) == {"jax", "torch", "torchax"}
    for name, values in losses.items():
        assert len(values) == 6 and max(abs(a - b) for a, b in zip(values, losses["jax"])) < 1e-5, (
            name
        )
        predictions, targets, loss = step0(tmp_path / "run" / name)
        assert predictions.shape == targets.shape == (16, 3)  # num_outputs float targets
        # the loss each side trained on is the twin's smooth L1, not the task's mean squared error
        assert loss == pytest.approx(smooth_l1(predictions, targets), rel=1e-5), name
        assert abs(loss - float(np.mean((predictions - targets) ** 2))) > 1e-3
    assert all(report["parity"][name]["passed"] for name in ("torch", "torchax"))


@pytest.mark.slow
def test_a_regressions_loss_is_the_mse_and_a_loss_misport_is_named_at_the_loss(
    tmp_path,
):
    proc, _ = compare(tmp_path / "mse", "regressor_mse", "jax,torch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("jax", "torch"):
        predictions, targets, loss = step0(tmp_path / "mse" / name)
        assert loss == pytest.approx(float(np.mean((predictions - targets) ** 2)), rel=1e-5)
    # optax's Huber loss taken for torch's smooth L1: the forwards agree, the losses do not
    proc, report = compare(tmp_path / "misported", "regressor_huber_misported", "jax,torch")
    assert proc.returncode == 1, proc.stderr[-3000:]
    parity = report["parity"]["torch"]
    assert (
        parity["first_divergent_step"] == 0 and parity["first_divergent_module"]["module"] is None
    )
    backward = parity["first_divergent_module_backward"]
    assert (
        backward["in_loss"]
        and backward["module"] is None
        and backward["input_grad_error"]["rel"] > 0.5
    )
    assert (
        "first divergent in the loss" in report["message"]
        and "first divergent module" not in report["message"]
    )
    predictions, targets, jax_loss = step0(tmp_path / "misported" / "jax")
    # optax's: delta times
    assert jax_loss == pytest.approx(BETA * smooth_l1(predictions, targets), rel=1e-5)


def regression_spec(tmp_path, y: np.ndarray, x: np.ndarray | None = None) -> RunSpec:
    x = np.zeros((len(y), 12), np.float32) if x is None else x
    np.savez(tmp_path / "xy.npz", x=x, y=y)
    model = TwinSpec(
        twin="t.py:t", task="regression", hparams={"input_shape": 12, "num_outputs": 3}
    )
    return RunSpec(
        model=model,
        train=TrainSpec(global_batch_size=4),
        data=DataSpec(dataset="arrays", path=str(tmp_path / "xy.npz")),
    ).validate()


@pytest.mark.error_case("data-file-bad")
@pytest.mark.parametrize(
    "y, message",
    [
        (
            np.zeros((8, 2), np.float32),
            r"targets have shape \(8, 2\), a regression with model.num_outputs=3 needs \(8, 3\)",
        ),
        (
            np.where(np.arange(24).reshape(8, 3) == 7, np.nan, 0.0),
            r"targets hold a NaN or Inf \(example 2\)",
        ),
    ],
)
def test_regression_targets_are_checked_before_anything_runs(tmp_path, y, message):
    with pytest.raises(DataError, match=message):
        make_dataset(regression_spec(tmp_path, y))


def test_regression_arrays_feed_float_targets_and_classifier_labels_stay_whole(tmp_path):
    y = np.arange(24, dtype=np.float64).reshape(8, 3) / 7
    batch = make_dataset(regression_spec(tmp_path, y)).global_batch(0)
    assert batch.targets.dtype == np.float32 and batch.targets.shape == (4, 3)
    assert set(map(tuple, batch.targets.round(5))) <= set(
        map(tuple, (y.astype(np.float32)).round(5))
    )
    spec = regression_spec(tmp_path, y)
    classifier = dataclasses.replace(
        spec,
        model=TwinSpec(
            twin="t.py:t", task="classification", hparams={"input_shape": 12, "num_classes": 3}
        ),
    )
    np.savez(
        tmp_path / "xy.npz", x=np.zeros((8, 12), np.float32), y=np.array([0, 1, 2, 0.5, 1, 2, 0, 1])
    )
    with pytest.raises(
        DataError, match="labels are float64 with fractions or NaN, a classifier needs integer"
    ):
        make_dataset(classifier)
    with pytest.raises(
        Exception,
        match="data.dataset=synthetic-tokens cannot feed model.task=regression; it needs "
        "synthetic-regression or arrays",
    ):
        dataclasses.replace(spec, data=DataSpec(dataset="synthetic-tokens")).validate()


@pytest.mark.error_case("twin-field-malformed")
@pytest.mark.parametrize(
    "loss, message",
    [
        (
            {"torch": "l.py:loss"},
            "loss names one function per side, keys torch and nnx; nnx missing",
        ),
        ({"torch": "l.py:loss", "nnx": "l.py:loss", "jax": "l.py:loss"}, "jax unknown"),
        (
            {"torch": "l.py:loss", "nnx": "loss"},
            r"loss\['nnx'\]='loss' must name the function as path/to/file.py",
        ),
        ("l.py:loss", "loss is a str, not a dict"),
    ],
)
def test_a_malformed_loss_declaration_is_one_line(loss, message):
    with pytest.raises(TwinError, match=message):
        check_fields(Twin(torch="m.py:T", nnx="m.py:N", task="regression", loss=loss), "twins.py:t")


def test_a_twins_constant_forward_keywords_reach_each_side_as_declared():
    from common.twin import forward_kwargs_of

    shared = Twin(torch="m.py:T", nnx="m.py:N", forward_kwargs={"return_loss": True})
    assert (
        forward_kwargs_of(shared, "torch")
        == forward_kwargs_of(shared, "nnx")
        == {"return_loss": True}
    )
    apart = Twin(
        torch="m.py:T", nnx="m.py:N", forward_kwargs={"torch": {"return_dict": False}, "nnx": {}}
    )
    assert (
        forward_kwargs_of(apart, "torch") == {"return_dict": False}
        and forward_kwargs_of(apart, "nnx") == {}
    )


@pytest.mark.error_case("twin-field-malformed")
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"return_loss": [True]},
            r"forward_kwargs\['return_loss'\]=\[True\] must be a number, string, boolean or None",
        ),
        (
            {"torch": {"not a name": 1}},
            r"forward_kwargs\['torch'\]\['not a name'\]: 'not a name' is not a keyword",
        ),
        ("return_loss", "forward_kwargs is a str, not a dict"),
    ],
)
def test_a_malformed_forward_keyword_is_one_line(kwargs, message):
    with pytest.raises(TwinError, match=message):
        check_fields(Twin(torch="m.py:T", nnx="m.py:N", forward_kwargs=kwargs), "twins.py:t")

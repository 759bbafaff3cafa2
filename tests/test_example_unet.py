"""examples/unet_denoiser through the door a user takes: a DDPM-style UNet on (noisy image,
timestep), fed by the twin's own numpy batch function, trained with a loss written once per
framework; an NHWC port of an NCHW model; its mis-ports exit 1 named at the module."""

import json

import numpy as np
import pytest

from common.data import make_dataset
from common.files.record import read_record
from common.spec.parse import run_spec_from_dict
from tests.test_examples import compare, losses_of_every_backend

UNET = "examples/unet_denoiser/twin.py"


@pytest.mark.slow
def test_the_unet_denoiser_passes_fed_its_own_batches(tmp_path):
    """jax, eager torch and torch_xla (torchax, left out to keep the suite short, runs convolutions
    in the ResNet's test: tests/test_examples.py)."""
    proc, report = compare(
        tmp_path / "run", "--twin", f"{UNET}:unet_tiny", "--backend", "jax,torch,torch_xla"
    )
    assert proc.returncode == 0, report["message"]
    # 1.08878 -> 0.80590
    losses = losses_of_every_backend(report, steps=6, names=("jax", "torch", "torch_xla"))
    assert (
        losses["jax"][0] == pytest.approx(1.08878, abs=1e-4)
        and losses["jax"][-1] < losses["jax"][0] - 0.2
    )
    # the loss each trained on is the twin's mean squared error against the batch's noise, made
    # again here
    run = tmp_path / "run" / "torch"
    spec = run_spec_from_dict(json.loads((run / "spec.json").read_text()))
    batch = make_dataset(spec).global_batch(0)
    assert sorted(batch.inputs) == ["t", "x"] and sorted(batch.targets) == ["noise"]
    assert batch.inputs["x"].shape == (8, 3, 16, 16) and batch.inputs["t"].dtype == np.int32
    with np.load(run / "tensors.npz") as f:
        # NCHW on both sides: the port's NHWC output brought back by the twin
        predicted = f["outputs/logits"]
    assert predicted.shape == (8, 3, 16, 16)
    assert read_record(run).losses[0] == pytest.approx(
        float(np.mean((predicted - batch.targets["noise"]) ** 2)), rel=1e-5
    )
    for name in ("torch", "torch_xla"):  # the port's output, brought back to NCHW, agrees on each
        assert report["parity"][name]["tensors"]["outputs/logits"]["within"], name
    # the timestep (1-D) reaches torch_xla's loader as (B, 1), reshaped inside the step: the
    # pipelined steps after the loop compile nothing new (a third 20 s program when it was reshaped
    # as the loader fetched it)
    assert report["backends"]["torch_xla"]["compiles"]["steady_state"] == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "twin, module",
    [
        ("unet_same_padding_down", "encoder.0.resample"),
        ("unet_groupnorm_eps", "encoder.0.res.gn_a"),
    ],
)
def test_the_unet_misports_are_named_at_their_module(tmp_path, twin, module):
    """Every GroupNorm of the epsilon mis-port differs; the first one's difference leaves its bound
    in some examples only, which the capture reaches because it starts where the logits differ most
    (the runs' own capture of the batch's first rows read decoder.1.res.gn_a, a later one)."""
    proc, report = compare(
        tmp_path / "run", "--twin", f"{UNET}:{twin}", "--backend", "jax,torch", "--activations"
    )
    assert proc.returncode == 1, report["message"]
    assert report["parity"]["torch"]["first_divergent_module"]["module"] == module, report[
        "message"
    ]

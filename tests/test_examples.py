"""The examples gallery through the door a user takes (`python -m compare --twin`): each correct port
passes on every backend with no divergent module; each mis-port exits 1 naming the module where it differs."""
import json

import pytest

from tests.helpers import run_cli

RESNET = "examples/resnet/twin.py"


def compare(out, *args, timeout=900):
    proc = run_cli("compare", "--quiet", "--out", str(out), *args, timeout=timeout)
    return proc, json.loads((out / "report.json").read_text())


@pytest.mark.slow
def test_the_resnet_passes_on_every_backend_and_every_module_agrees(tmp_path):
    """torchvision's ResNet (in-place ReLU, BatchNorm, projection shortcuts) against its NHWC NNX port, 16
    channels on 16x16 images: every backend passes, and each one's 28 step-0 modules (captured because of
    --activations) agree, none left out."""
    proc, report = compare(tmp_path / "run", "--twin", f"{RESNET}:resnet_tiny", "--backend", "all", "--activations")
    assert proc.returncode == 0, report["message"]
    for name in ("torch", "torch_xla", "torchax"):
        parity = report["parity"][name]
        assert parity["passed"] and parity["loss"]["max_abs"] < 1e-4, name
        found = parity["first_divergent_module"]
        assert found["module"] is None and found["modules_compared"] == 28 and found["not_compared"] == {}, name


@pytest.mark.slow
def test_the_resnet_padding_misport_is_named_at_its_convolution(tmp_path):
    proc, report = compare(tmp_path / "run", "--twin", f"{RESNET}:resnet_tiny_same_padding", "--backend", "jax,torch")
    assert proc.returncode == 1
    found = report["parity"]["torch"]["first_divergent_module"]
    assert found["module"] == "layer2.layers.0.conv1" and found["input_agrees"], found
    assert "first divergent module layer2.layers.0.conv1" in report["message"]

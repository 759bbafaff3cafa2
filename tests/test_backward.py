"""Step 0's backward pass located by module: the capture differentiates the loss at every recorded
module's input and output (zero probes), and compare/judge/backward.py names the first module, in
the order the backward pass ends them, whose input gradient differs while its output gradient
agrees."""

import json

import numpy as np
import pytest

from common.files.record import read_record
from common.files.tensor_file import read_tensors
from compare.judge.backward import first_divergent_module_backward
from compare.runs.capture_runs import CAPTURE_DIR
from tests.helpers import run_cli

USER = "tests/data/user_project/twins.py"
GRAD = {"atol": 1e-6, "rtol": 1e-3}  # the default fp32 grad tolerance (compare/judge/tolerances.py)


def grads_of(broken: str | None) -> tuple[list[str], dict]:
    """A block `blocks.0` holding `fc` then `act` (finished in that order, the block last, the model
    around it): the activation keys as captured (inputs when a module starts) and the loss's
    gradient at each, with everything upstream of `broken`'s backward off from there on."""
    order = [
        "(model):in",
        "blocks.0:in",
        "blocks.0.fc:in",
        "blocks.0.fc",
        "blocks.0.act:in",
        "blocks.0.act",
        "blocks.0",
        "head:in",
        "head",
        "(model)",
    ]
    rng, grads, off = np.random.default_rng(0), {}, False
    # the order the backward ends
    for module in ["head", "blocks.0.act", "blocks.0.fc", "blocks.0", "(model)"]:
        # flowing in: off once a culprit passed
        grads[module] = rng.standard_normal(4) + (1.0 if off else 0.0)
        off = off or module == broken
        grads[f"{module}:in"] = rng.standard_normal(4) + (1.0 if off else 0.0)
    return order, grads


@pytest.mark.parametrize("broken", ["head", "blocks.0.act", "blocks.0.fc"])
def test_the_module_whose_backward_parts_is_named_not_the_block_around_it(broken):
    order, ref = grads_of(None)
    _, other = grads_of(broken)
    found = first_divergent_module_backward(ref, other, order, GRAD, ("jax", "torch"))
    assert (
        found["module"] == broken and found["output_grad_agrees"] and found["modules_compared"] == 5
    )
    assert found["input_grad_error"]["abs"] == pytest.approx(1.0)
    assert first_divergent_module_backward(ref, ref, order, GRAD)["module"] is None
    # a side captured no gradients
    assert first_divergent_module_backward(ref, {}, order, GRAD) is None


@pytest.mark.slow
def test_a_custom_backward_misport_is_named_at_its_module_and_a_correct_one_passes(tmp_path):
    """torch's head runs a custom autograd function whose backward passes the input gradient back
    through max(W, 0): the forwards agree (every module's activation), the gradients do not. The
    head is named, from the capture runs' gradients; the same function with the right backward
    passes."""
    out = tmp_path / "misported"
    proc = run_cli(
        "compare",
        "--quiet",
        "--twin",
        f"{USER}:backward_misported",
        "--backend",
        "jax,torch",
        "--out",
        str(out),
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    parity = report["parity"]["torch"]
    forward, backward = parity["first_divergent_module"], parity["first_divergent_module_backward"]
    assert (
        parity["first_divergent_step"] == 0
        and forward["module"] is None
        and forward["modules_compared"] == 4
    )
    assert backward["module"] == "fc2" and backward["output_grad_agrees"], backward
    assert report["message"].startswith(
        "torch: parity failed: first divergent step 0, first divergent module in "
        "the backward pass fc2; worst tensor grads/fc1.kernel"
    )
    captured = {
        n: read_tensors(out / n / CAPTURE_DIR, read_record(out / n / CAPTURE_DIR))[
            "activation_grads"
        ]
        for n in ("jax", "torch")
    }
    gap = {
        k: float(np.max(np.abs(captured["jax"][k] - captured["torch"][k]))) for k in captured["jax"]
    }
    # into the head agrees, out of it not
    assert max(gap["(model)"], gap["fc2"]) < 1e-7 and gap["fc2:in"] > 1e-2
    assert backward["input_grad_error"]["abs"] == pytest.approx(gap["fc2:in"], rel=1e-6)
    # everything it feeds back differs
    assert all(gap[k] > 1e-3 for k in ("norm", "norm:in", "fc1")), gap
    md = (out / "report.md").read_text()
    assert (
        "| first divergent module, backward pass (step 0) | fc2 (the gradient flowing into it "
        "agrees, the one "
        "it passes back does not" in md
    )
    proc = run_cli(
        "compare",
        "--quiet",
        "--twin",
        f"{USER}:custom_backward",
        "--backend",
        "jax,torch",
        "--out",
        str(tmp_path / "correct"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]

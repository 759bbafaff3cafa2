"""A learned scalar (a 0-d parameter: CLIP's logit_scale, a temperature, a gate) keeps its shape
through the run's start file and every runtime, and is compared as any parameter (issue 45: it was
written as (1,) and refused)."""

import json

import pytest
from safetensors.numpy import load_file

from tests.helpers import run_cli

TWINS = "tests/data/scalar_param/twins.py"


@pytest.mark.slow
def test_a_scalar_parameter_is_carried_and_compared_on_every_runtime(tmp_path):
    out = tmp_path / "run"
    proc = run_cli(
        "compare", "--quiet", "--out", str(out), "--twin", f"{TWINS}:scaled", "--backend", "all"
    )
    report = json.loads((out / "report.json").read_text())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert load_file(out / "start" / "init.safetensors")["logit_scale"].shape == ()
    for name in ("torch", "torch_xla", "torchax"):
        tensors = report["parity"][name]["tensors"]
        assert (
            tensors["params/logit_scale"]["within"]
            and tensors["params/logit_scale"]["elements"] == 1
        ), name
        assert tensors["grads/logit_scale"]["within"], name


@pytest.mark.slow
def test_a_misported_scale_fails(tmp_path):
    out = tmp_path / "run"
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(out),
        "--twin",
        f"{TWINS}:scaled_misported",
        "--backend",
        "jax,torch",
        "--activations",
    )
    report = json.loads((out / "report.json").read_text())
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert not report["parity"]["torch"]["tensors"]["grads/logit_scale"]["within"]
    # proj agrees; the model's own code scales
    found = report["parity"]["torch"]["first_divergent_module"]
    assert (found["module"], found["input_agrees"]) == ("(model)", True)


@pytest.mark.slow
@pytest.mark.error_case("override-changes-tree")
def test_a_one_sided_override_that_changes_the_parameters_is_a_usage_error_naming_them(tmp_path):
    """--jax-set on a twin's hyperparameter that changes the NNX model's parameters cannot start
    from the common start: one line naming the parameter and the way out (it was `AssertionError:
    proj.kernel`, exit 3)."""
    out = tmp_path / "run"
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(out),
        "--twin",
        f"{TWINS}:scaled",
        "--backend",
        "jax,torch",
        "--jax-set",
        "model.features=6",
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "AssertionError" not in proc.stderr
    # found by the NNX side's describe step, which builds the model jax runs too: before any run
    # directory (was: after the torch side trained)
    assert proc.stderr.strip() == (
        "error: the NNX model built for this run has proj.kernel of shape (6, 4), the start's is "
        "(8, 4): its hyperparameters build another model than the common start was made for (an "
        "override on one side, its --jax-set, that changes the parameters?); set it on both sides "
        "with --set"
    )
    assert not out.exists()

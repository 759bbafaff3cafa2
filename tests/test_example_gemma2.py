"""examples/gemma2 through the door a user takes: Hugging Face's own Gemma2ForCausalLM, whose
embedding is an nn.Embedding subclass with a forward of its own, against an NNX port whose embedder
subclasses nnx.Embed. Every captured tensor's layout comes from the op that made it, so the correct
port names no module, forward or backward (before, the torch side stored its embedding's output
transposed and blamed `embedder` with "output shapes differ"); each mis-port is named where it
differs."""

import pytest

from tests.test_examples import compare

GEMMA2 = "examples/gemma2/twin.py"


@pytest.mark.slow
def test_hugging_faces_gemma2_passes_with_no_module_named_forward_or_backward(tmp_path):
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{GEMMA2}:gemma2_tiny",
        "--backend",
        "jax,torch,torch_xla",
        "--steps",
        "3",
        "--activations",
    )
    assert proc.returncode == 0, report["message"]
    for name in ("torch", "torch_xla"):
        parity = report["parity"][name]
        assert parity["passed"] and parity["loss"]["max_abs"] < 1e-4, name
        forward = parity["first_divergent_module"]
        assert forward["module"] is None and forward["modules_compared"] >= 25, (name, forward)
        assert forward["shapes_differ"] == [] and forward["not_compared"] == {}, (name, forward)
        backward = parity["first_divergent_module_backward"]
        assert backward["module"] is None and backward["modules_compared"] >= 25, (name, backward)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("twin", "module"),
    [
        ("gemma2_norm_times_w", "layers.0.input_layernorm"),
        ("gemma2_scaled_by_head_dim", "layers.0.attn"),
        ("gemma2_window_off_by_one", "layers.0.attn"),
        ("gemma2_no_final_softcap", "(model)"),
    ],
)
def test_a_gemma2_misport_is_named_at_its_module(tmp_path, twin, module):
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{GEMMA2}:{twin}",
        "--backend",
        "jax,torch",
        "--steps",
        "1",
        "--activations",
    )
    assert proc.returncode == 1, report["message"]
    found = report["parity"]["torch"]["first_divergent_module"]
    assert found["module"] == module and found["input_agrees"], found
    assert found["shapes_differ"] == [], found

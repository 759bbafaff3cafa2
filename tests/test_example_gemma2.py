"""examples/gemma2 through the door a user takes: Hugging Face's own Gemma2ForCausalLM, whose
embedding is an nn.Embedding subclass with a forward of its own, against an NNX port whose embedder
subclasses nnx.Embed. Every captured tensor's layout comes from the op that made it, so the correct
port names no module, forward or backward (before, the torch side stored its embedding's output
transposed and blamed `embedder` with "output shapes differ"); each mis-port is named where it
differs."""

import json

import pytest

from compare.runs.rundir import MARKER
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
    ("twin", "module", "backends"),
    [
        ("gemma2_norm_times_w", "layers.0.input_layernorm", "jax,torch,torchax"),
        ("gemma2_scaled_by_head_dim", "layers.0.attn", "jax,torch"),
        ("gemma2_window_off_by_one", "layers.0.attn", "jax,torch"),
        ("gemma2_no_final_softcap", "(model)", "jax,torch"),
    ],
)
def test_a_gemma2_misport_is_named_at_its_module(tmp_path, twin, module, backends):
    """On torchax too, where the model meets torchax's padding_idx behaviour: the run with it made
    eager torch's still fails, so the line says it does not explain the difference."""
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{GEMMA2}:{twin}",
        "--backend",
        backends,
        "--steps",
        "1",
        "--activations",
    )
    assert proc.returncode == 1, report["message"]
    for name in backends.split(",")[1:]:
        found = report["parity"][name]["first_divergent_module"]
        assert found["module"] == module and found["input_agrees"], (name, found)
        assert found["shapes_differ"] == [], found
    if "torchax" in backends:
        behaviours = report["parity"]["torchax"]["runtime_behaviours"]
        assert behaviours["met"] == {"embedding-padding-idx": {"padding_idx": [0]}}
        assert behaviours["matched"]["passed"] is False
        assert (
            "not explained by torchax's own behaviour (embedding-padding-idx)"
            in (report["message"])
        )


@pytest.mark.slow
def test_torchax_parts_from_a_correct_gemma2_by_its_own_padding_idx_behaviour_and_says_so(
    tmp_path,
):
    """Gemma's pad id is 0 and torchax gives the padding row a gradient where eager torch gives it
    none (common/runtime_behaviours.py): found by the op check before training, and, the pair
    failing, confirmed by a run with the behaviour made eager torch's, which passes. The port is
    not blamed; the exit stays 1 (torchax does train this model otherwise)."""
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{GEMMA2}:gemma2_tiny",
        "--backend",
        "jax,torchax",
        "--steps",
        "3",
    )
    assert proc.returncode == 1
    parity = report["parity"]["torchax"]
    assert not parity["passed"] and parity["first_divergent_module"] is None
    assert report["ops"]["torchax"]["behaviours"] == {"embedding-padding-idx": {"padding_idx": [0]}}
    matched = parity["runtime_behaviours"]["matched"]
    assert matched["passed"] is True and matched["run_dir"] == str(
        tmp_path / "run" / "matched" / "torchax"
    )
    assert (
        "explained by torchax's own behaviour, not the port: torchax differentiates"
        in (report["message"])
    )
    # the matched run is the run's own: listed in its marker, so an --overwrite removes it and no
    # later run of that folder reads it as its own
    marker = json.loads((tmp_path / "run" / MARKER).read_text())
    assert "matched/torchax/record.json" in marker["files"]
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{GEMMA2}:gemma2_tiny",
        "--backend",
        "jax,torch",
        "--steps",
        "1",
        "--overwrite",
    )
    assert proc.returncode == 0, report["message"]
    assert not (tmp_path / "run" / "matched").exists()
    assert "runtime_behaviours" not in report["parity"]["torch"]

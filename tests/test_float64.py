"""The float64 proof end to end (--dtype float64, issue 43): every runtime computes in float64 on
the host and correct ports agree to float64's rounding; mis-ports that float32's bounds cannot see
fail in float64 at their module; a Hugging Face model's own float32 code is found and named, not
blamed."""

import numpy as np
import pytest

from common.files.record import read_record
from common.files.tensor_file import read_tensors
from tests.helpers import run_cli
from tests.test_examples import compare

pytestmark = pytest.mark.slow
CONVNEXT, WAV2VEC2, BERT = (
    "tests/data/convnext/twin.py",
    "tests/data/wav2vec2/twin.py",
    "examples/bert_mlm/twin.py",
)


def test_gpt_tiny_in_float64_agrees_to_float64_rounding_on_every_runtime(tmp_path):
    """JAX, eager torch and torchax agree to ~1e-15 (measured: losses 4e-15 apart, logits 6e-16
    relative); torch_xla, whose GELU rounds its constants to float32, to ~1e-9, judged by its own
    float64 rtol and said so. Every kept tensor is float64, and no module computes narrower."""
    out = tmp_path / "run"
    proc, report = compare(out, "--backend", "all", "--dtype", "float64", "--steps", "3")
    assert proc.returncode == 0, report["message"]
    assert report["dtype"] == "float64" and report["tolerances"]["grad"]["rtol"] == 1e-9
    for name in ("torch", "torchax"):
        parity = report["parity"][name]
        assert (
            parity["loss"]["max_abs"] < 1e-12 and parity["tensors"]["outputs/logits"]["rel"] < 1e-13
        ), name
        assert (
            "float64_allowances" not in parity and parity["sensitivity"]["logits"]["every"] < 2e-9
        ), name
    xla = report["parity"]["torch_xla"]
    assert 1e-12 < xla["tensors"]["outputs/logits"]["rel"] < 3e-8  # GELU's float32 constants
    assert "GELU with constants rounded to float32" in xla["float64_allowances"]["torch_xla"]
    for name in report["backends"]:
        run = out / name
        record = read_record(run)
        assert record.float32_islands == {} and record.numerics["dtype"] == "float64", name
        tensors = read_tensors(run, record)
        assert tensors["grads"]["blocks.0.mlp.fc.kernel"].dtype == np.float64, name
        assert tensors["outputs"]["logits"].dtype == np.float64, name
    md = (out / "report.md").read_text()
    assert "- torch: would have caught a relative change of 1e-09 in logits" in md


@pytest.mark.parametrize(
    "twin, module",
    [
        (f"{CONVNEXT}:convnext_tanh_gelu", "stages.0.layers.0"),
        # HF has no module for the MLP: its GELU lies in the layer
        (f"{BERT}:bert_tanh_gelu", "layers.0"),
        (f"{WAV2VEC2}:misport_tanh_gelu", "encoder.layers.0.mlp"),
        # flax's GroupNorm epsilon, 1e-6
        (f"{WAV2VEC2}:misport_gn_eps", "feature_encoder.convs.0.norm"),
    ],
)
def test_a_mis_port_within_float32s_bounds_fails_in_float64_at_its_module(tmp_path, twin, module):
    """flax's tanh-approximate GELU for the exact one, or its GroupNorm epsilon for torch's: within
    every float32 bound at init (the run passes), out of float64's at the module whose code differs
    (one step: step 0 is where a port error shows)."""
    proc, report = compare(
        tmp_path / "f32", "--twin", twin, "--backend", "jax,torch", "--steps", "1"
    )
    assert proc.returncode == 0, report["message"]
    proc, report = compare(
        tmp_path / "f64",
        "--twin",
        twin,
        "--backend",
        "jax,torch",
        "--steps",
        "1",
        "--dtype",
        "float64",
        "--activations",
    )
    assert proc.returncode == 1, report["message"]
    found = report["parity"]["torch"]["first_divergent_module"]
    assert found["module"] == module and found["input_agrees"], found
    assert report["parity"]["torch"]["first_divergent_step"] == 0


def test_an_adamw_epsilon_float32_cannot_see_fails_in_float64_at_the_first_update(tmp_path):
    """eps 1e-6 on the JAX side for torch's 1e-8 (a one-sided --jax-set, so the runs stay
    comparable): float32's bounds pass it; in float64 step 0 agrees (nothing updated yet) and step
    1's loss parts."""
    args = (
        "--spec",
        "mlp-tiny",
        "--backend",
        "jax,torch",
        "--steps",
        "3",
        "--jax-set",
        "train.eps=1e-6",
    )
    proc, report = compare(tmp_path / "f32", *args)
    assert proc.returncode == 0, report["message"]
    proc, report = compare(tmp_path / "f64", *args, "--dtype", "float64")
    parity = report["parity"]["torch"]
    assert proc.returncode == 1 and parity["first_divergent_step"] == 1, report["message"]
    step0 = {
        key: row for key, row in parity["tensors"].items() if key.startswith(("outputs/", "grads/"))
    }
    assert step0 and all(row["within"] for row in step0.values())  # the forward and backward agree
    assert not all(
        row["within"] for key, row in parity["tensors"].items() if key.startswith("params/")
    )


def test_hugging_faces_qwen2_passes_in_float64_with_its_float32_islands_kept_and_named(tmp_path):
    """Qwen2 as Hugging Face writes it computes RMSNorm's variance, the rotary table and the
    attention softmax in float32 on purpose; the port mirrors the rotary table. Kept as written
    (train.float32_casts=keep), both sides name those modules, the pair is judged at float32's
    bounds from the first island on, and the report says so: its tolerance table prints the
    bounds applied, not float64's."""
    out = tmp_path / "run"
    proc, report = compare(
        out,
        "--twin",
        "examples/hf_qwen2/twin.py:qwen2_tiny",
        "--backend",
        "jax,torch",
        "--dtype",
        "float64",
        "--steps",
        "2",
        "--set",
        "train.float32_casts=keep",
    )
    assert proc.returncode == 0, report["message"]
    islands = report["parity"]["torch"]["float32_islands"]
    assert {"layers.0.input_layernorm", "layers.0.attn", "norm"} <= set(islands["torch"])
    assert islands["torch"]["layers.0.input_layernorm"].startswith("float32: _to_copy, pow, mean")
    assert "layers.0.attn" in islands["jax"]  # the port's rotary table, float32 as in HF's code
    assert report["parity"]["torch"]["sensitivity"]["logits"]["every"] > 1e-5  # float32's bounds
    md = (out / "report.md").read_text()
    assert (
        "float32 islands (jax: layers.0.attn" in md and "tensors judged at float32's bounds" in md
    )
    assert "## Tolerances applied to jax vs torch (float32 islands: float32's bounds" in md
    assert "## Tolerances (float64" not in md  # float64's own table was applied to no pair
    assert "| forward before the first island | 1e-13 | 1e-09 | 0 |" in md


@pytest.mark.parametrize("float32_casts", ["widen", "keep"])
def test_a_rotary_base_off_by_one_fails_in_float64_with_hugging_faces_casts_widened(
    tmp_path, float32_casts
):
    """HF's Llama as it ships casts its norms, rotary table and softmax to float32; a port whose
    rotary base is 10001 for 10000 differs by ~6e-5, below float32's bounds. With those casts
    widened on both sides (the default) the model computes in float64 end to end and the mis-port
    is named at layers.0.attn; kept, the islands hide it and the pair passes at float32's bounds.
    The correct port in float64, widened, agrees to float64's rounding on every runtime: that run
    of the four is tests/test_generation.py's Llama decode test's (the same training, judged
    there)."""
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        "examples/llama/twin.py:llama_hf_rope_base_off",
        "--backend",
        "jax,torch",
        "--dtype",
        "float64",
        "--steps",
        "1",
        "--set",
        f"train.float32_casts={float32_casts}",
    )
    parity = report["parity"]["torch"]
    if float32_casts == "keep":
        assert proc.returncode == 0 and parity["float32_islands"], report["message"]
        assert parity["float32_casts_widened"] == {}
        return
    assert proc.returncode == 1 and parity["float32_islands"] == {}, report["message"]
    assert parity["first_divergent_module"]["module"] == "layers.0.attn"
    widened = parity["float32_casts_widened"]
    assert widened["torch"][".float()"] >= 1 and widened["torch"]["softmax(dtype=float32)"] >= 1
    assert widened["jax"]["arange(dtype=float32)"] >= 1  # the port's rotary table


def test_hugging_faces_bert_passes_in_float64_on_torchax_after_its_module_capture(tmp_path):
    """BERT's tied decoder and word embeddings through torchax with --activations: the capture once
    moved the run's own model to torchax tensors (Module.to works in place), and training from step
    1 on drifted 4e-3 from JAX's in float32 and in float64 alike; it captures a copy now. In float64
    every step agrees to ~1e-15."""
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{BERT}:bert_tiny",
        "--backend",
        "jax,torch,torchax",
        "--dtype",
        "float64",
        "--steps",
        "3",
        "--activations",
    )
    assert proc.returncode == 0, report["message"]
    for name in ("torch", "torchax"):
        parity = report["parity"][name]
        assert parity["passed"] and parity["loss"]["max_abs"] < 1e-12, name
        # the port's softmax and loss follow the run's dtype
        assert parity["float32_islands"] == {}, name
        diverging = parity["first_divergent_module"]
        # HF's ModelOutput leads with the loss, the port's dict with the logits: a shape-only note
        # (issue 45)
        assert diverging["modules_diverging"] <= 1 and diverging["output_error"]["abs"] is None, (
            name
        )


@pytest.mark.error_case("float64-model-fixes-float32")
@pytest.mark.parametrize(
    ("twin", "module"), [("fixes_float32", "fc1"), ("fixes_float32_later", "fc2")]
)
def test_a_torch_model_that_fixes_float32_is_refused_in_float64_naming_its_module(
    tmp_path, twin, module
):
    """`.float()` before a float64 Linear (the first layer's input, or past the first layer, which
    the describe step's own checks used to skip: its float32 model could not take the float64
    example): eager torch cannot multiply them where the run keeps the model's casts to float32
    (train.float32_casts=keep; widened, the default, it computes in float64). The twin's describe
    step finds it before any backend runs: one line naming the module and the fix, exit 2, no run
    directory."""
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(tmp_path / "run"),
        "--twin",
        f"tests/data/user_project/twins.py:{twin}",
        "--backend",
        "jax,torch",
        "--dtype",
        "float64",
        "--set",
        "train.float32_casts=keep",
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert f"the torch model cannot compute in float64 as written: at module {module}" in errors[0]
    assert "make it follow its input's dtype" in errors[0] and not (tmp_path / "run").exists()


@pytest.mark.error_case("float64-model-fixes-float32")
def test_an_op_with_no_float64_kernel_is_named_as_such_with_the_switch_that_avoids_it(tmp_path):
    """Hugging Face's Mixtral as it ships runs its experts with grouped_mm, which has no float64
    kernel: the refusal says so and names the switch, not "its code fixes float32"."""
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(tmp_path / "run"),
        "--twin",
        "examples/mixtral/twin.py:mixtral_tiny",
        "--backend",
        "jax,torch",
        "--dtype",
        "float64",
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert "at module model.layers.0.mlp.experts, Expected mat_a to be Float32" in errors[0]
    assert "(an op with no float64 kernel: Hugging Face's MoE experts run grouped_mm" in errors[0]
    assert "experts_implementation='eager'" in errors[0] and "fixes float32" not in errors[0]
    assert not (tmp_path / "run").exists()

"""Bring your own twin: `python -m compare --twin`, the Python API and the pytest plugin on a user's
own models (tests/data/user_project, a throwaway project of its own) and the Llama example twin."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO, run_cli

USER = "tests/data/user_project/twins.py"
LLAMA = "examples/llama/twin.py"


def compare(*args, timeout=900):
    return run_cli("compare", "--quiet", *args, timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize(
    "twin, message",
    [
        (f"{USER}x:net", r"file .*twins.pyx does not exist"),
        ("tests/data/user_project/models.py", "must look like path/to/file.py:name"),
        ("tests/data/user_project/missing.py:net", "missing.py does not exist"),
        (f"{USER}:no_such_twin", "has no 'no_such_twin'"),
        (
            f"{USER}:torch_raises",
            "torch factory models.py:raises raised ValueError: hidden must be even",
        ),
        (
            f"{USER}:nnx_not_a_module",
            "NNX factory models.py:not_a_module returned a dict, not a flax.nnx.Module",
        ),
        (
            f"{USER}:net_renamed",
            "parameter trees do not correspond \\(rename .*fc2.*out.* in the "
            "twin would match all 2\\): torch has 2 unmatched .*fc2.weight \\[5, 32\\].*"
            "NNX has 2 unmatched .*out.kernel \\[32, 5\\] \\(closest fc2.weight \\[5, 32\\]\\)",
        ),
        pytest.param(
            "tests/data/upsampler/twins.py:upsampler_fed_nchw",
            r"the NNX forward raised on inputs of shape \[1, 3, 8, 8\] \(.*\) and runs on them "
            r"channel-last: "
            r"add nnx_input_axes=\(0, 2, 3, 1\) to the twin",
            marks=pytest.mark.error_case("twin-nhwc-fed-nchw"),
        ),
    ],
)
@pytest.mark.error_case("twin-not-loading", "twin-factory-fails", "twin-trees-differ")
def test_bad_twins_are_one_line_exit_2_and_leave_no_run_directory(tmp_path, twin, message):
    out = tmp_path / "run"
    proc = compare("--twin", twin, "--backend", "jax,torch", "--out", str(out))
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert __import__("re").search(message, errors[0]), errors[0]
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.error_case("twin-code-raises")
def test_an_exception_in_a_twins_own_forward_reads_the_same_on_every_backend(tmp_path):
    out = tmp_path / "run"
    # the tables printed (not --quiet): they hold each backend's message
    args = ("--twin", f"{USER}:small_batches", "--backend", "all", "--out", str(out))
    proc = run_cli("compare", *args, timeout=900)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "verdict: fail (backend_failed)" in proc.stdout  # its tables printed whole
    report = json.loads((out / "report.json").read_text())
    for name, module in (
        ("jax", "jax_impl"),
        ("torch", "torch_impl"),
        ("torch_xla", "torch_xla_impl"),
        # traced under jit, run eagerly, traced lazily
        ("torchax", "torchax_impl"),
    ):
        backend = report["backends"][name]
        assert backend["status"] == "failed" and backend["exit_code"] == 3
        assert backend["message"] == (
            f"{module} crashed: ValueError: [/data/batches.cc:57] the net takes at most 8 examples "
            "per batch, got 16 (rerun with --debug for the traceback)"
        )
    # printed as it is, on stderr and in the tables (no markup: was exit 6, a rich MarkupError)
    assert "error: torch: failed: torch_impl crashed: ValueError: [/data/batches.cc:57]" in (
        proc.stderr
    )


@pytest.mark.slow
def test_a_user_twin_passes_from_its_torch_init(tmp_path):
    from compare import check_twin

    report = check_twin(f"{USER}:net", out=tmp_path / "run", python=sys.executable)
    assert report.passed and report.exit_code == 0, report.message
    worst = max(t["abs"] for t in report.data["parity"]["torch"]["tensors"].values())
    assert worst < 1e-5
    prepared = tmp_path / "run" / "start"
    assert {"spec.json", "init.safetensors", "correspondence.json"} <= {
        p.name for p in prepared.iterdir()
    }
    links = json.loads((prepared / "correspondence.json").read_text())
    assert {"torch": "fc1.weight", "canonical": ["fc1.kernel"], "layout": "transpose"} in links
    assert report.first_divergent_module("torch") is None
    # fsdp needs no partition rules: every parameter is split along its
    # largest dimension the axis divides
    sharded = check_twin(
        f"{USER}:net",
        backends="jax,torchax",
        mesh="fsdp=2",
        out=tmp_path / "fsdp",
        python=sys.executable,
    )
    assert sharded.passed, sharded.message
    assert sharded.data["parity"]["torchax"]["loss"]["max_abs"] < 1e-5


@pytest.mark.slow
def test_llama_twin_passes_single_device_and_on_a_mesh(tmp_path):
    # single device on jax and torch; torch_xla and torchax run it on the mesh below (a process
    # fewer each)
    proc = compare(
        "--twin",
        f"{LLAMA}:llama_tiny",
        "--backend",
        "jax,torch",
        "--steps",
        "6",
        "--out",
        str(tmp_path / "a"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert list(report["parity"]) == ["torch"]
    for parity in report["parity"].values():  # measured: logits 2.7e-7, |Δloss| <= 2.4e-6
        assert (
            parity["loss"]["max_abs"] < 1e-4 and parity["tensors"]["outputs/logits"]["abs"] < 1e-5
        )
    proc = compare(
        "--twin",
        f"{LLAMA}:llama_tiny",
        "--backend",
        "jax,torch_xla,torchax",
        "--mesh",
        "data=2,tensor=2",
        "--steps",
        "6",
        "--out",
        str(tmp_path / "b"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((tmp_path / "b" / "jax" / "record.json").read_text())
    assert record["extra"]["mesh_strategy"] == "dpxtp"


@pytest.mark.slow
def test_misported_rotary_fails_at_step_0_in_layer_0_attention(tmp_path):
    out = tmp_path / "run"
    proc = compare(
        "--twin",
        f"{LLAMA}:llama_tiny_misported",
        "--backend",
        "jax,torch",
        "--steps",
        "3",
        "--out",
        str(out),
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    parity = json.loads((out / "report.json").read_text())["parity"]["torch"]
    found = parity["first_divergent_module"]
    assert (
        parity["first_divergent_step"] == 0
        and found["module"] == "layers.0.attn"
        and found["input_agrees"]
    )
    # captured for this
    assert sorted(p.parent.name for p in out.glob("*/activations")) == ["jax", "torch"]
    markdown = (out / "report.md").read_text()
    assert "first divergent step 0, first divergent module layers.0.attn" in markdown


@pytest.mark.slow
def test_pytest_plugin_in_a_throwaway_project(tmp_path):
    """A user's project outside the repo, nothing installed by hand: the plugin comes with the
    toolkit."""
    project = tmp_path / "my_port"
    shutil.copytree(REPO / "tests" / "data" / "user_project", project)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    out = proc.stdout
    assert proc.returncode == 1 and "1 failed, 1 passed" in out, out[-3000:]
    assert "test_misported" in out and "twin twins.py:net_misported fails parity" in out
    assert "first divergent step 0, first divergent module (model)" in out


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, backends", [("model_outputs", "jax,torch,torchax"), ("torch_scores", "jax,torch")]
)
def test_forwards_that_return_several_outputs_are_compared_on_their_logits(
    tmp_path, name, backends
):
    """A Hugging Face ModelOutput on the torch side and (logits, hidden) on the NNX side; a dict
    whose logits the twin names (`logits="scores"`): every runtime takes the same output and passes
    (the torch runtimes pick it with one function, common/twin/outputs.py: one twin runs them
    all)."""
    proc = compare(
        "--twin", f"{USER}:{name}", "--backend", backends, "--out", str(tmp_path / "run")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    for parity in report["parity"].values():
        assert parity["passed"] and parity["tensors"]["outputs/logits"]["abs"] < 1e-5
        assert parity["tensors"]["eval/logits"]["within"]


UPSAMPLER = "tests/data/upsampler/twins.py"


@pytest.mark.slow
def test_a_conv_transpose_port_passes_and_a_padding_misport_is_named_at_it(tmp_path):
    """torch's ConvTranspose2d against nnx.ConvTranspose, as many channels out as in: the layout
    comes from the module types (flipped, Flax's default) and the correct port agrees module by
    module; torch's padding=1 copied into Flax (where it means another size) is named at the
    ConvTranspose, whose input agrees though its output has another shape."""
    out = tmp_path / "run"
    proc = compare(
        "--twin",
        f"{UPSAMPLER}:upsampler",
        "--backend",
        "jax,torch",
        "--out",
        str(out),
        "--activations",
    )
    assert proc.returncode == 0, proc.stderr
    links = {
        link["torch"]: link["layout"]
        for link in json.loads((out / "start" / "correspondence.json").read_text())
    }
    assert links["up.weight"] == "conv_transpose" and links["down.weight"] == "conv"
    spec = json.loads((out / "start" / "spec.json").read_text())
    # what every backend derives with (the Linear head's probe agrees with the rule: not carried)
    assert spec["model"]["layouts"] == {"up.kernel": "conv_transpose"}
    found = json.loads((out / "report.json").read_text())["parity"]["torch"][
        "first_divergent_module"
    ]
    assert (
        found["module"] is None and found["modules_compared"] == 5 and found["not_compared"] == {}
    ), found
    proc = compare(
        "--twin",
        f"{UPSAMPLER}:upsampler_torch_padding",
        "--backend",
        "jax,torch",
        "--out",
        str(tmp_path / "misported"),
        "--activations",
    )  # captured by the runs themselves
    assert proc.returncode == 1, proc.stderr
    report = json.loads((tmp_path / "misported" / "report.json").read_text())
    found = report["parity"]["torch"]["first_divergent_module"]
    assert found["module"] == "up" and found["input_agrees"], found
    assert found["output_error"]["note"] == (
        "output shapes differ: jax [2, 7, 7, 8], torch [2, 8, 8, 8] (both channel-last)"
    )


WAV2VEC2 = "tests/data/wav2vec2/twin.py"


@pytest.mark.slow
def test_hugging_faces_wav2vec2_is_captured_and_a_boundary_drawn_apart_does_not_fail_a_correct_port(
    tmp_path,
):
    """A new user's port of HF's Wav2Vec2 (unchanged: its feature encoder sets requires_grad on its
    input, which the backward's gradient probes made a computed tensor) crashed eager torch under
    --activations, and so in every capture of a mis-port. The forward is now captured alone, with a
    warning. That user's first rename put HF's inner positional Conv1d (its output before the trim)
    on the port's pos_conv, as well as the whole positional embedding around it: the outer one holds
    the path (common/twin/modules.py), whose output is the port's, so every module agrees and
    nothing is named (the inner conv's untrimmed output, taken before, differed in shape only: a
    location that never failed the verdict, tests/test_parity_units.py)."""
    out = tmp_path / "run"
    proc = compare(
        "--twin",
        f"{WAV2VEC2}:w2v_inner_conv",
        "--backend",
        "jax,torch",
        "--steps",
        "2",
        "--activations",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    parity = json.loads((out / "report.json").read_text())["parity"]["torch"]
    assert parity["passed"] and not parity["by_module"]
    found = parity["first_divergent_module"]
    assert (
        found["module"] is None and not found["shapes_differ"] and found["modules_compared"] >= 20
    ), found
    # its ModuleLists (conv_layers, layers) are never called, having no forward: not "parameters
    # used directly"
    assert not [
        k
        for k, why in found["not_compared"].items()
        if "its forward never ran" in why and "torch:" in why
    ]
    assert (
        "the step-0 backward was not captured: the model sets requires_grad"
        in (out / "torch" / "stderr.log").read_text()
    )


CONVNEXT = "tests/data/convnext/twin.py"
SWIN = "tests/data/swin/twin.py"


@pytest.mark.slow
def test_a_swin_whose_norms_have_flaxs_epsilon_fails_at_a_norm_though_every_tensor_is_within(
    tmp_path,
):
    """torchvision's Swin against a new user's NNX port with flax's LayerNorm epsilon (1e-6, torch's
    1e-5): every step-0 tensor stays within its float32 bound (the logits at 97 %), so it passed,
    beside a report naming a norm whose output parts with its input agreeing. That module now fails
    the run. torchvision's attention reads its qkv and proj weights with F.linear: those modules
    never run, and the report says so (it said torch had no module mapped to their paths)."""
    out = tmp_path / "run"
    proc = compare(
        "--twin",
        f"{SWIN}:swin_ln_eps_misported",
        "--backend",
        "jax,torch",
        "--steps",
        "2",
        "--activations",
        "--out",
        str(out),
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    parity = report["parity"]["torch"]
    assert parity["by_module"] and all(t["within"] for t in parity["tensors"].values())
    found = parity["first_divergent_module"]
    assert found["input_agrees"] and found["module"].endswith(("norm", "norm1", "norm2")), found[
        "module"
    ]
    assert (
        f"first divergent module {found['module']}: its output leaves its bound though its input "
        "agrees" in report["message"]
    )
    never = {
        k
        for k, why in found["not_compared"].items()
        if why.startswith("torch: its forward never ran")
    }
    assert never == {
        f"stages.{s}.blocks.{b}.attn.{m}" for s in (0, 1) for b in (0, 1) for m in ("qkv", "proj")
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "twin, module", [("convnext", None), ("convnext_block_eps_misported", "stages.0.layers.0.norm")]
)
def test_torchvisions_convnext_is_compared_module_by_module(tmp_path, twin, module):
    """torchvision's ConvNeXt as a new user brought it: LayerNorm2d (a LayerNorm subclass permuting
    NCHW around it), blocks that permute to channel-last and back (torchvision's Permute) around a
    (dim, 1, 1) layer scale (declared 'd 1 1 -> d'), a head norm fed (N, C, 1, 1) where the port has
    (N, C). The correct port passes with every module compared and none differing (it was blamed at
    stem_norm, on a passing run, with its blocks left out); the blocks' LayerNorm at torch's default
    epsilon is named at that norm."""
    out = tmp_path / "run"
    proc = compare(
        "--twin", f"{CONVNEXT}:{twin}", "--backend", "jax,torch", "--activations", "--out", str(out)
    )
    assert proc.returncode == (0 if module is None else 1), proc.stderr[-2000:]
    found = json.loads((out / "report.json").read_text())["parity"]["torch"][
        "first_divergent_module"
    ]
    assert (
        found["module"] == module
        and found["not_compared"] == {}
        and found["modules_compared"] == 20
    )
    if module is None:
        assert found["modules_diverging"] == 0
        links = {
            link["torch"]: link["layout"]
            for link in json.loads((out / "start" / "correspondence.json").read_text())
        }
        assert links["features.1.0.layer_scale"] == "d 1 1 -> d"
    else:
        assert found["input_agrees"]

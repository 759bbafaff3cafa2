"""Kernel twins (Twin.kernel_arg, compare/judge/kernels.py): the NNX Llama port's Pallas kernels
(examples/llama/kernels.py: jax's flash attention, an own fused RMSNorm), run in interpret mode on
the CPU, against Hugging Face's Llama with SDPA; each kernel side judged by its noise floor against
a float64 oracle of its own reference op; kernel mis-ports named at their module; the bridge through
torchax bit for bit."""

import json

import numpy as np
import pytest

from common.files.record import read_record
from common.twin import Twin, TwinError
from common.twin.fields import check_fields
from compare.judge.kernels import floor_losses, floor_tensors
from tests.helpers import run_cli

LLAMA = "examples/llama/twin.py"


def compare(out, twin, kernel, *args):
    """One compare of `twin` with the NNX side's kernel switch at `kernel`, into a new folder of
    `out`."""
    out.mkdir(parents=True, exist_ok=True)
    run = out / f"{twin}-{len(list(out.iterdir()))}"
    result = run_cli(
        "compare",
        "--twin",
        f"{LLAMA}:{twin}",
        "--jax-set",
        f"model.kernel={kernel}",
        "--backend",
        "jax,torch",
        "--activations",
        "--out",
        str(run),
        "--quiet",
        *args,
        timeout=900,
    )
    return result, json.loads((run / "report.json").read_text()), run


def test_a_kernel_is_within_its_floor_where_the_reference_error_bounds_it():
    oracle = {"outputs": {"logits": np.array([1.0, 2.0])}}
    reference = {"outputs": {"logits": np.array([1.0 + 1e-6, 2.0])}}
    within = {"outputs": {"logits": np.array([1.0 - 2e-6, 2.0])}}
    outside = {"outputs": {"logits": np.array([1.0, 2.0 + 1e-3])}}
    row = floor_tensors(within, reference, oracle, "float32")["outputs/logits"]
    assert row["within"] and row["bound"] == pytest.approx(3e-6 + 2 * 2.0**-23, rel=1e-6)
    assert not floor_tensors(outside, reference, oracle, "float32")["outputs/logits"]["within"]
    # bfloat16's eps widens the floor by its own rounding, not float32's
    assert floor_tensors(outside, reference, oracle, "bfloat16")["outputs/logits"]["within"]
    # a NaN the kernel made is outside, whatever its finite values measure
    broken = {"outputs": {"logits": np.array([np.nan, 2.0])}}
    assert not floor_tensors(broken, reference, oracle, "float32")["outputs/logits"]["within"]
    losses = floor_losses([1.0, 1.5], [1.0 + 1e-6, 1.0], [1.0, 1.0], "float32")
    assert losses["first_outside_step"] == 1
    # trained parameters are the optimizer's draw, left to the pair's parity: not judged here
    trained = {"params": {"w": np.array([0.02])}}
    moved = {"params": {"w": np.array([0.02 + 3e-3])}}  # Adam's first step: +-lr by a sign
    assert floor_tensors(moved, trained, trained, "float32") == {}


def test_a_kernel_switch_must_name_a_hyperparameter_holding_the_reference():
    twin = Twin(torch="t.py:m", nnx="n.py:m", hparams={"kernel": "reference"}, kernel_arg="kernel")
    check_fields(twin, "t")
    for bad in ("kernels", 3):
        with pytest.raises(TwinError, match="kernel_arg=.* must name a hyperparameter"):
            check_fields(Twin(torch="t.py:m", nnx="n.py:m", kernel_arg=bad), "t")


def test_the_same_kernel_through_torchax_agrees_bit_for_bit(monkeypatch):
    """Hugging Face's attention answered by the NNX side's flash kernel through torchax's call_jax
    (examples/llama/hf_llama.py), differentiated as the torchax runtime does (its torch code as a
    JAX function): its heads-first layout, grouped-query repeat and scale bring the kernel the same
    inputs as the NNX side's call, so the outputs and gradients are equal bit for bit."""
    import jax
    import jax.numpy as jnp
    from torchax.interop import jax_view

    monkeypatch.syspath_prepend("examples/llama")
    import hf_llama
    import kernels

    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 64, 16)).astype(np.float32)  # HF's (B, H, T, hd)
    k, v = (rng.standard_normal((2, 2, 64, 16)).astype(np.float32) for _ in range(2))

    def torch_side(q, k, v):
        return hf_llama._pallas_attention(None, q, k, v, None, scaling=0.25)[0]

    def nnx_side(q, k, v):
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
        k, v = (jnp.repeat(x, 2, axis=2) for x in (k, v))
        return kernels.flash_attention(q, k, v, 0.25)

    args = [jnp.asarray(x) for x in (q, k, v)]
    weights = jnp.asarray(rng.standard_normal((2, 64, 4, 16)).astype(np.float32))
    results = [
        jax.value_and_grad(lambda *a, f=f: (f(*a) * weights).sum(), argnums=(0, 1, 2))(*args)
        for f in (jax_view(torch_side), nnx_side)
    ]
    (loss_torch, grads_torch), (loss_nnx, grads_nnx) = results
    assert np.array_equal(np.asarray(loss_torch), np.asarray(loss_nnx))
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(grads_torch, grads_nnx))
    out = jax.jit(jax_view(torch_side))(*args)
    assert np.array_equal(np.asarray(out), np.asarray(nnx_side(*args)))


@pytest.mark.slow
def test_flash_attention_passes_in_float32_and_a_mask_one_block_ahead_is_named(tmp_path):
    result, report, run = compare(tmp_path, "llama_kernels", "pallas")
    assert result.returncode == 0, result.stderr[-2000:]
    judged = report["kernels"]["jax"]
    assert (
        judged["passed"] and judged["kernel"] == "pallas" and judged["judged_by"] == "noise floor"
    )
    attention = judged["tensors"]["activations/layers.0.attn"]
    # the kernel's error from the float64 oracle is of the reference op's size, not zero: it ran
    assert 0 < attention["kernel_error"] <= attention["bound"] < 1e-5
    assert judged["tensors"]["grads/layers.0.attn.q_proj.kernel"]["within"]
    floor = read_record(run / "kernels" / "jax" / "float64" / "record.json").spec
    assert floor["model"]["hparams"]["kernel"] == "reference"
    assert floor["train"]["dtype"] == "float64"
    assert read_record(run / "jax" / "record.json").spec["model"]["hparams"]["kernel"] == "pallas"
    assert "torch" not in report["kernels"]  # the side calling SDPA has no kernel to judge

    result, report, run = compare(tmp_path, "llama_kernels_block_ahead", "pallas")
    assert result.returncode == 1
    judged = report["kernels"]["jax"]
    assert not judged["passed"] and judged["first_module"] == "layers.0.attn"
    assert report["parity"]["torch"]["first_divergent_module"]["module"] == "layers.0.attn"
    assert "jax's kernel 'pallas' is outside its noise floor at layers.0.attn" in report["message"]


@pytest.mark.slow
def test_flash_attention_in_bfloat16_is_judged_by_its_floor_and_a_missing_scale_named(tmp_path):
    # the pair by the fixed bfloat16 bounds: the kernel's own floor is what this test is about
    bf16 = ("--dtype", "bfloat16", "--bf16-tolerance", "fixed")
    result, report, run = compare(tmp_path, "llama_kernels", "pallas", *bf16)
    assert result.returncode == 0, result.stderr[-2000:]
    judged = report["kernels"]["jax"]
    assert judged["passed"] and judged["losses"]["first_outside_step"] is None
    # bfloat16 rounding: errors far over float32's that the floor measured, not assumed
    assert judged["tensors"]["outputs/logits"]["reference_error"] > 1e-4

    result, report, run = compare(tmp_path, "llama_kernels_unscaled", "pallas", *bf16)
    assert result.returncode == 1
    judged = report["kernels"]["jax"]
    assert not judged["passed"] and judged["first_module"] == "layers.0.attn"
    row = judged["tensors"]["grads/layers.0.attn.q_proj.kernel"]
    assert row["kernel_error"] > 10 * row["bound"]


@pytest.mark.slow
def test_the_fused_rms_norm_runs_in_float64_and_flash_attention_is_said_not_to(tmp_path):
    result, report, run = compare(tmp_path, "llama_kernels", "pallas-norm", "--dtype", "float64")
    assert result.returncode == 0, result.stderr[-2000:]
    judged = report["kernels"]["jax"]
    assert judged["passed"] and judged["float64"] == "ran"
    assert judged["judged_by"] == "float64 bounds"
    norm = judged["tensors"]["activations/layers.0.input_layernorm"]
    assert norm["error"] < 1e-12  # float64 rounding, where float32's would be ~1e-7

    result, report, run = compare(
        tmp_path, "llama_kernels_eps_outside", "pallas-norm", "--dtype", "float64"
    )
    assert result.returncode == 1
    judged = report["kernels"]["jax"]
    assert not judged["passed"] and judged["first_module"] == "layers.0.input_layernorm"

    result, report, run = compare(tmp_path, "llama_kernels", "pallas", "--dtype", "float64")
    assert result.returncode == 3
    assert report["kernels"]["jax"]["float64"] == "unsupported"
    assert "jax's kernel 'pallas' does not run in float64" in report["message"]
    assert (run / "kernels" / "jax" / "reference" / "record.json").exists()


@pytest.mark.slow
def test_the_experts_grouped_matmul_is_proven_in_float64_against_their_dense_dispatch(tmp_path):
    """Mixtral's NNX experts as one `jax.lax.ragged_dot` a projection (kernel "ragged_dot") against
    the port's dense dispatch, in float64, beside Hugging Face's Mixtral with its experts run one by
    one (grouped_mm has no float64 kernel)."""
    out = tmp_path / "moe"
    result = run_cli(
        "compare",
        "--twin",
        "examples/mixtral/twin.py:mixtral_kernels",
        "--jax-set",
        "model.kernel=ragged_dot",
        "--backend",
        "jax,torch",
        "--dtype",
        "float64",
        "--activations",
        "--out",
        str(out),
        "--quiet",
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    judged = report["kernels"]["jax"]
    assert judged["passed"] and judged["float64"] == "ran" and judged["kernel"] == "ragged_dot"
    experts = judged["tensors"]["activations/layers.0.moe.experts"]
    assert experts["error"] < 1e-12 < experts["bound"]
    assert report["parity"]["torch"]["passed"]


def test_a_kernel_switch_that_changed_nothing_is_not_a_pass(tmp_path, monkeypatch):
    """A kernel side whose run equals its reference run bit for bit (a kernel name the factory
    ignores) is said not judged, never passed; one whose run failed is the runs' to say."""
    from types import SimpleNamespace

    from compare.judge import kernels

    run = SimpleNamespace(losses=[1.0, 0.5], status="ok", message="")
    tensors = {"grads": {"w": np.ones(3)}, "activations": {"attn": np.zeros(2)}}
    same = kernels._same_run((run, tensors), (run, {k: dict(v) for k, v in tensors.items()}))
    moved = {"grads": {"w": np.ones(3) + 1e-7}, "activations": tensors["activations"]}
    assert same and not kernels._same_run((run, tensors), (run, moved))
    side = kernels.KernelSide("kernel", "ragged-dot", "reference")
    reads = iter([(run, tensors), (run, tensors)])  # its run, then its reference run
    monkeypatch.setattr(kernels, "_read", lambda path, run_id: next(reads))
    judged = kernels.judge_side(tmp_path, "jax", side, "float32", None, {}, None)
    assert judged["passed"] is None and "changed nothing" in judged["why"]
    assert not judged.get("runs_say")


@pytest.mark.slow
@pytest.mark.error_case("twin-factory-fails")
def test_a_kernel_name_the_factory_refuses_is_refused_before_any_run_directory(tmp_path):
    """A backend's own hyperparameters are built by its side's describe step too."""
    result = run_cli(
        "compare",
        "--twin",
        "examples/llama/twin.py:llama_kernels",
        "--backend",
        "jax,torch",
        "--jax-set",
        "model.kernel=palas",
        "--out",
        str(tmp_path / "x"),
    )
    assert result.returncode == 2 and not (tmp_path / "x").exists()
    assert result.stderr.strip() == (
        "error: NNX factory nnx_llama.py:Llama raised KeyError: 'palas' (the model jax runs, as "
        "its --jax-set sets it)"
    )


def test_a_kernel_runs_floor_folder_is_the_runs_own_and_replaced_with_it(tmp_path):
    """The kernel floor runs live in <run>/kernels/: a run lists what it wrote there, so
    --overwrite removes them with it (a later run never holds an earlier run's floor) and leaves
    the user's own file beside them as it was."""
    from compare.__main__ import run_entries
    from compare.runs import rundir

    out = tmp_path / "run"
    first = rundir.claim(out, "first", run_entries(["jax", "torch"]), False, {})
    floor = out / "kernels" / "jax" / "float64" / "record.json"
    floor.parent.mkdir(parents=True)
    floor.write_text('{"run_id": "first"}')
    (out / "notes.txt").write_text("mine")
    first.finish("ok")
    assert "kernels/jax/float64/record.json" in first.files()
    rundir._lock(first._lock_fd, out, release=True)
    second = rundir.claim(out, "second", run_entries(["jax", "torch"]), True, {})
    assert not (out / "kernels").exists() and second.replaced["run_id"] == "first"
    assert (out / "notes.txt").read_text() == "mine"

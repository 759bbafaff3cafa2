"""examples/mixtral through the door a user takes: Hugging Face's own MixtralForCausalLM, unchanged,
against an NNX port with dense expert dispatch. Routing that rounding flips at ties (a
zero-initialised router, a router scaled to near-ties) passes, the flips counted and the check that
decided shown; routing mis-ports fail where they rank, an experts' mis-port at the experts
(common/capture/decisions.py, compare/judge/decided.py)."""

import pytest

from common.files.record import RECORD_FILE, read_record
from tests.helpers import run_cli
from tests.test_examples import compare

MIXTRAL = "examples/mixtral/twin.py"


@pytest.mark.slow
@pytest.mark.parametrize("twin", ["mixtral_router_zeroed", "mixtral_router_near_ties"])
def test_routing_flipped_at_ties_passes_with_the_flips_counted_and_the_imposed_check_shown(
    tmp_path, twin
):
    proc, report = compare(
        tmp_path / "run", "--twin", f"{MIXTRAL}:{twin}", "--backend", "jax,torch"
    )
    parity = report["parity"]["torch"]
    assert proc.returncode == 0, report["message"]
    found = parity["decisions"]
    assert found["matched"] and found["flipped"] > 0 and found["ties_only"], found
    first = found["first"]
    # torch.topk runs in HF's router module, jax.lax.top_k in the port's
    # MoE block: each side's own module
    assert (first["module"], first["other_module"], first["op"], first["k"]) == (
        "layers.0.moe",
        "layers.0.moe.router",
        "topk",
        2,
    )
    assert first["widest_margin"] <= first["bound"]
    # the check that decided: torch's capture with jax's choices imposed,
    # every module and gradient agreeing
    assert found["imposed"]["agrees"] and found["imposed"]["modules_compared"] >= 20
    imposed = read_record(tmp_path / "run" / "torch" / "activations" / "imposed" / RECORD_FILE)
    assert imposed.run_id == report["run_id"] and len(imposed.extra.decisions) == len(
        found["decisions"]
    )
    assert parity["first_divergent_module"]["module"] is None
    # a passing run names none
    assert not (parity["first_divergent_module_backward"] or {}).get("module")
    assert "steps after 0 not judged" in parity["not_judged"]
    markdown = (tmp_path / "run" / "report.md").read_text()
    assert "step-0 decisions" in markdown and "every flip within rounding of a tie" in markdown
    # what the verdict could not see, in the line under it
    assert (
        "torch: would have caught" in proc.stdout + markdown
        and "steps after 0 not judged" in markdown
    )


@pytest.mark.slow
def test_a_routing_mis_port_that_changes_the_choices_fails_where_it_ranks(tmp_path):
    """The router's softmax over the tokens instead of the experts: its choices differ by far more
    than rounding, so the pair fails at the MoE block that ranks, not at the experts the other
    choices reach."""
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{MIXTRAL}:mixtral_softmax_over_tokens",
        "--backend",
        "jax,torch",
    )
    parity = report["parity"]["torch"]
    assert proc.returncode == 1 and not parity["passed"]
    found = parity["first_divergent_module"]
    assert (
        found["module"] == "layers.0.moe"
        and found["decision"]["widest_margin"] > found["decision"]["bound"]
    )
    assert (
        "not a tie" in report["message"]
        and "first divergent module layers.0.moe;" in report["message"]
    )
    assert not (tmp_path / "run" / "torch" / "activations" / "imposed").exists()  # no tie to check


@pytest.mark.slow
@pytest.mark.parametrize(
    "twin",
    [
        "mixtral_gelu_experts",
        "mixtral_not_renormalised",
        "mixtral_top_k_experts",
        "mixtral_top_k_not_renormalised",
    ],
)
def test_a_mis_port_that_keeps_the_first_choices_is_named_at_the_experts_or_at_the_routing(
    tmp_path, twin
):
    """Layer 0 routes alike on both sides in both. GELU for the experts' SiLU: the experts' every
    input agrees (the hidden states, and the routing: HF's indices and weights against the port's
    dense matrix), their output does not. The top-k weights not renormalised: the routing weights
    the MoE block passes its experts differ, so the block is named, not the experts ("input
    agrees"); a flip it causes downstream is said to follow. A port whose experts take HF's own
    arguments (indices and weights): the correct one passes, its weights not renormalised name the
    block too, saying which argument (every argument is compared like for like)."""
    proc, report = compare(
        tmp_path / "run", "--twin", f"{MIXTRAL}:{twin}", "--backend", "jax,torch"
    )
    parity = report["parity"]["torch"]
    found = parity["first_divergent_module"]
    if twin == "mixtral_top_k_experts":
        assert proc.returncode == 0 and parity["passed"], report["message"]
        return
    assert proc.returncode == 1
    assert parity["decisions"]["decisions"][0]["flipped"] == 0  # layer 0 chose alike
    if twin == "mixtral_top_k_not_renormalised":
        assert found["module"] == "layers.0.moe", found
        via = found["entered_through"]
        assert (via["module"], via["what"]) == ("layers.0.moe.experts", "3rd argument")
        assert not via["error"]["within"] and via["error"]["rel"] > 1e-3
        assert "(the 3rd argument it passes to layers.0.moe.experts differs)" in report["message"]
    elif twin == "mixtral_gelu_experts":
        assert found["module"] == "layers.0.moe.experts" and found["input_agrees"], found
        assert found["inputs_not_compared"] == 0 and "entered_through" not in found
    else:
        assert found["module"] == "layers.0.moe", found
        via = found["entered_through"]
        assert (via["module"], via["what"]) == ("layers.0.moe.experts", "routing weights")
        assert not via["error"]["within"]
        assert "(the routing weights it passes to layers.0.moe.experts differ)" in report["message"]
        assert parity["decisions"].get("after") in (None, "layers.0.moe")


@pytest.mark.slow
@pytest.mark.error_case("impose-decisions-refused")
def test_a_runtime_that_cannot_take_another_sides_choices_refuses_them_in_one_line(tmp_path):
    proc = run_cli(
        "jax_impl",
        "--spec",
        "mlp-tiny",
        "--activations-only",
        "--impose-decisions",
        str(tmp_path),
        "--out",
        str(tmp_path / "run"),
    )
    assert proc.returncode == 2 and not (tmp_path / "run").exists()
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: --impose-decisions: the jax backend cannot take another "
        "side's decisions; only torch can"
    )


@pytest.mark.slow
def test_where_a_pair_parts_after_an_agreeing_step_0_both_sides_choices_there_are_captured_and_said(
    tmp_path,
):
    """torch's learning rate 5 % apart (one-sided, so the runs stay comparable): step 0 agrees,
    choices included, and the runs part later. compare captures both sides' choices at that step,
    each from the weights its own steps left, over the step's whole batch, and says how many differ,
    where and with what margins; the noise floor it measures decides (the lr apart fails by it)."""
    out = tmp_path / "run"
    proc, report = compare(
        out,
        "--twin",
        f"{MIXTRAL}:mixtral_tiny",
        "--backend",
        "jax,torch",
        "--activations",
        "--torch-set",
        "train.lr=0.00315",
    )
    parity = report["parity"]["torch"]
    assert proc.returncode == 1 and report["tolerance_policy"]["policy"] == "noise-floor"
    # step 0 chose alike
    assert parity["decisions"]["matched"] and parity["decisions"]["flipped"] == 0
    later = parity["decisions_later"]
    step = later["step"]
    assert (
        step >= 1
        and f"the runs parted at step {step} after a step 0" in report["tolerance_policy"]["why"]
    )
    for name in ("jax", "torch"):
        capture = read_record(out / name / "activations" / f"at-step-{step}" / RECORD_FILE)
        assert capture.run_id == report["run_id"] and capture.extra.capture_step == step
        assert len(capture.extra.decisions) == len(parity["decisions"]["decisions"]) == 2
    assert later["matched"] and [d["module"] for d in later["decisions"]] == [
        "layers.0.moe",
        "layers.1.moe",
    ]
    # the step's whole batch: every token
    assert all(d["rows"] == 8 * 32 for d in later["decisions"])
    # a flip crosses no wider a margin than the two sides' scores are apart
    for d in later["decisions"]:
        assert not d["flipped"] or d["widest_margin"] <= d["scores_max_abs"], d
    assert f"at step {step}, where the runs part" in report["message"]
    assert (
        f"| decisions where the runs part | at step {step}, where the runs part"
        in (out / "report.md").read_text()
    )


@pytest.mark.slow
@pytest.mark.error_case("capture-step-refused")
def test_a_runtime_whose_capture_cannot_follow_its_training_refuses_a_later_step_in_one_line(
    tmp_path,
):
    proc = run_cli(
        "torchax_impl",
        "--spec",
        "mlp-tiny",
        "--activations-only",
        "--capture-step",
        "2",
        "--out",
        str(tmp_path / "run"),
    )
    assert proc.returncode == 2 and not (tmp_path / "run").exists()
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: --capture-step: takes --activations-only and a backend that captures from the "
        "weights training left; "
        "the torchax backend does not"
    )


@pytest.mark.slow
def test_transformers_default_save_pretrained_of_mixtral_loads_as_from_pretrained_loads_it(
    tmp_path,
):
    """transformers 5 writes Mixtral's original per-expert layout
    (block_sparse_moe.experts.E.w1/w2/w3) by default and stacks it on loading; common/twin/hf.py
    stacks it the same way, bit for bit, and the port passes from it."""
    import numpy as np
    import torch
    from safetensors.numpy import load_file
    from transformers import MixtralForCausalLM

    from common.twin import load_twin, resolve
    from common.twin.hf import to_torch_names

    twin = load_twin(f"{MIXTRAL}:mixtral_tiny")
    torch.manual_seed(3)
    resolve(twin.torch, twin.base_dir)(**twin.hparams).save_pretrained(tmp_path / "hf")
    written = load_file(tmp_path / "hf" / "model.safetensors")
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in written
    users = {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}
    loaded = MixtralForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    ours = to_torch_names(written, twin, "hf")
    assert set(ours) == set(loaded) and all(
        np.array_equal(ours[k], loaded[k].numpy()) for k in loaded
    )

    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{MIXTRAL}:mixtral_tiny",
        "--backend",
        "jax,torch",
        "--steps",
        "3",
        "--checkpoint",
        f"hf:{tmp_path / 'hf'}",
    )
    assert proc.returncode == 0, report["message"]
    assert (
        report["weights"].startswith(f"the hf checkpoint {tmp_path / 'hf'}")
        and report["parity"]["torch"]["passed"]
    )
    # read, never written
    assert {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()} == users

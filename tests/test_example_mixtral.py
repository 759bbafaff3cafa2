"""examples/mixtral through the door a user takes: Hugging Face's own MixtralForCausalLM, unchanged, against an NNX
port with dense expert dispatch. Routing that rounding flips at ties (a zero-initialised router, a router scaled to
near-ties) passes, the flips counted and the check that decided shown; routing mis-ports fail where they rank, an
experts' mis-port at the experts (common/capture/decisions.py, compare/judge/decided.py)."""
import pytest

from common.files.record import RECORD_FILE, read_record
from tests.helpers import run_cli
from tests.test_examples import compare

MIXTRAL = "examples/mixtral/twin.py"


@pytest.mark.slow
@pytest.mark.parametrize("twin", ["mixtral_router_zeroed", "mixtral_router_near_ties"])
def test_routing_flipped_at_ties_passes_with_the_flips_counted_and_the_imposed_check_shown(tmp_path, twin):
    proc, report = compare(tmp_path / "run", "--twin", f"{MIXTRAL}:{twin}", "--backend", "jax,torch")
    parity = report["parity"]["torch"]
    assert proc.returncode == 0, report["message"]
    found = parity["decisions"]
    assert found["matched"] and found["flipped"] > 0 and found["ties_only"], found
    first = found["first"]
    # torch.topk runs in HF's router module, jax.lax.top_k in the port's MoE block: each side's own module
    assert (first["module"], first["other_module"], first["op"], first["k"]) == \
        ("layers.0.moe", "layers.0.moe.router", "topk", 2)
    assert first["widest_margin"] <= first["bound"]
    # the check that decided: torch's capture with jax's choices imposed, every module and gradient agreeing
    assert found["imposed"]["agrees"] and found["imposed"]["modules_compared"] >= 20
    imposed = read_record(tmp_path / "run" / "torch" / "activations" / "imposed" / RECORD_FILE)
    assert imposed.run_id == report["run_id"] and len(imposed.extra.decisions) == len(found["decisions"])
    assert parity["first_divergent_module"]["module"] is None
    assert not (parity["first_divergent_module_backward"] or {}).get("module")  # a passing run names none
    assert "steps after 0 not judged" in parity["not_judged"]
    markdown = (tmp_path / "run" / "report.md").read_text()
    assert "step-0 decisions" in markdown and "every flip within rounding of a tie" in markdown
    # what the verdict could not see, in the line under it
    assert "torch: would have caught" in proc.stdout + markdown and "steps after 0 not judged" in markdown


@pytest.mark.slow
def test_a_routing_mis_port_that_changes_the_choices_fails_where_it_ranks(tmp_path):
    """The router's softmax over the tokens instead of the experts: its choices differ by far more than rounding,
    so the pair fails at the MoE block that ranks, not at the experts the other choices reach."""
    proc, report = compare(tmp_path / "run", "--twin", f"{MIXTRAL}:mixtral_softmax_over_tokens", "--backend",
                           "jax,torch")
    parity = report["parity"]["torch"]
    assert proc.returncode == 1 and not parity["passed"]
    found = parity["first_divergent_module"]
    assert found["module"] == "layers.0.moe" and found["decision"]["widest_margin"] > found["decision"]["bound"]
    assert "not a tie" in report["message"] and "first divergent module layers.0.moe;" in report["message"]
    assert not (tmp_path / "run" / "torch" / "activations" / "imposed").exists()  # no tie to check


@pytest.mark.slow
@pytest.mark.parametrize("twin", ["mixtral_gelu_experts", "mixtral_not_renormalised"])
def test_a_mis_port_that_keeps_the_first_choices_is_named_at_the_experts_or_at_the_routing(tmp_path, twin):
    """Layer 0 routes alike on both sides in both. GELU for the experts' SiLU: the experts' every input agrees (the
    hidden states, and the routing: HF's indices and weights against the port's dense matrix), their output does
    not. The top-k weights not renormalised: the routing weights the MoE block passes its experts differ, so the
    block is named, not the experts ("input agrees"); a flip it causes downstream is said to follow."""
    proc, report = compare(tmp_path / "run", "--twin", f"{MIXTRAL}:{twin}", "--backend", "jax,torch")
    parity = report["parity"]["torch"]
    found = parity["first_divergent_module"]
    assert proc.returncode == 1
    assert parity["decisions"]["decisions"][0]["flipped"] == 0  # layer 0 chose alike
    if twin == "mixtral_gelu_experts":
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
    proc = run_cli("jax_impl", "--spec", "mlp-tiny", "--activations-only", "--impose-decisions", str(tmp_path),
                   "--out", str(tmp_path / "run"))
    assert proc.returncode == 2 and not (tmp_path / "run").exists()
    assert proc.stderr.strip().splitlines()[-1] == ("error: --impose-decisions: the jax backend cannot take another "
                                                    "side's decisions; only torch can")


@pytest.mark.slow
def test_transformers_default_save_pretrained_of_mixtral_loads_as_from_pretrained_loads_it(tmp_path):
    """transformers 5 writes Mixtral's original per-expert layout (block_sparse_moe.experts.E.w1/w2/w3) by default
    and stacks it on loading; common/twin/hf.py stacks it the same way, bit for bit, and the port passes from it."""
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
    assert set(ours) == set(loaded) and all(np.array_equal(ours[k], loaded[k].numpy()) for k in loaded)

    proc, report = compare(tmp_path / "run", "--twin", f"{MIXTRAL}:mixtral_tiny", "--backend", "jax,torch",
                           "--steps", "3", "--checkpoint", f"hf:{tmp_path / 'hf'}")
    assert proc.returncode == 0, report["message"]
    assert report["weights"].startswith(f"the hf checkpoint {tmp_path / 'hf'}") and report["parity"]["torch"]["passed"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()} == users  # read, never written

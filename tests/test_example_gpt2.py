"""examples/hf_gpt2 through the door a user takes: Hugging Face's own GPT2LMHeadModel, whose
`Conv1D` projections hold (in, out) weights, against an NNX port with Linear kernels, from a
save_pretrained directory with no layout declared. The describe step probes how each projection uses
its weight (the square `c_proj` included, which no shape can tell); a q|k|v split in the wrong order
is named at the attention; a port with a head of its own is refused naming HF's tie."""

import json

import pytest

from tests.helpers import run_cli
from tests.test_examples import compare

GPT2 = "examples/hf_gpt2/twin.py"


@pytest.mark.slow
def test_hugging_faces_gpt2_passes_from_hf_on_every_backend_with_no_layout_declared(tmp_path):
    import torch

    from common.twin import load_twin, resolve

    twin = load_twin(f"{GPT2}:gpt2_tiny")
    assert not twin.layouts
    torch.manual_seed(3)
    model = resolve(twin.torch, twin.base_dir)(**twin.hparams)
    with torch.no_grad():  # biases away from their zero init: a transposed c_proj would show
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(std=0.3)
    model.save_pretrained(tmp_path / "hf")
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{GPT2}:gpt2_tiny",
        "--backend",
        "all",
        "--steps",
        "3",
        "--checkpoint",
        f"hf:{tmp_path / 'hf'}",
        "--activations",
    )
    assert proc.returncode == 0, report["message"]
    links = json.loads((tmp_path / "run" / "start" / "correspondence.json").read_text())
    layouts = {link["torch"]: link["layout"] for link in links}
    for conv1d in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
        assert layouts[f"transformer.h.0.{conv1d}.weight"] == "same", conv1d
    probed = json.loads((tmp_path / "run" / "start" / "torch_weights.json").read_text())
    assert probed["orientations"]["transformer.h.1.attn.c_proj.weight"] == "in_out"
    assert probed["ties"] == {"lm_head.weight": "transformer.wte.weight"}
    for name in ("torch", "torch_xla", "torchax"):
        parity = report["parity"][name]
        assert parity["passed"] and parity["loss"]["max_abs"] < 1e-4, name
        assert parity["tensors"]["outputs/logits"]["abs"] < 1e-5, name
        found = parity["first_divergent_module"]
        assert found["module"] is None and found["modules_compared"] >= 20, (name, found)


@pytest.mark.slow
def test_a_gpt2_port_splitting_qkv_in_the_wrong_order_is_named_at_the_attention(tmp_path):
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{GPT2}:gpt2_qkv_misported",
        "--backend",
        "jax,torch",
        "--steps",
        "2",
        "--activations",
    )
    assert proc.returncode == 1, report["message"]
    found = report["parity"]["torch"]["first_divergent_module"]
    assert found["module"] == "h.0.attn" and found["input_agrees"], found


@pytest.mark.slow
@pytest.mark.error_case("twin-trees-differ")
def test_a_gpt2_port_with_its_own_head_is_refused_naming_hfs_tie(tmp_path):
    proc = run_cli(
        "compare", "--twin", f"{GPT2}:gpt2_untied", "--backend", "jax,torch", "--out", str(tmp_path)
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        "lm_head.kernel [64, 256] (torch's lm_head.weight is transformer.wte.weight: tied, one "
        "tensor; compute the port's lm_head from that tensor" in proc.stderr
    ), proc.stderr


@pytest.mark.slow
def test_a_port_with_separate_q_k_v_meets_hf_conv1d_c_attn_packed_along_its_columns(tmp_path):
    """HF's `c_attn` is one Conv1D whose (in, 3 * out) weight holds q|k|v side by side in its
    columns; a port with three projections of its own declares `packed` and nothing else. The
    parts stack along the axis the module's outputs lie on, which the probe of its orientation
    decides (1 here; 0 for nn.Linear): before, they were stacked along rows and refused. Passes on
    every runtime."""
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{GPT2}:gpt2_split_qkv",
        "--backend",
        "all",
        "--steps",
        "2",
        "--activations",
    )
    assert proc.returncode == 0, report["message"]
    links = json.loads((tmp_path / "run" / "start" / "correspondence.json").read_text())
    packed = {link["torch"]: link for link in links if len(link["canonical"]) == 3}
    weight = packed["transformer.h.0.attn.c_attn.weight"]
    assert weight["canonical"] == ["h.0.attn.q.kernel", "h.0.attn.k.kernel", "h.0.attn.v.kernel"]
    assert (weight["layout"], weight["axis"]) == ("same", 1)
    assert "axis" not in packed["transformer.h.0.attn.c_attn.bias"]  # its rows: said by none
    for name in ("torch", "torch_xla", "torchax"):
        parity = report["parity"][name]
        assert parity["passed"] and parity["tensors"]["outputs/logits"]["abs"] < 1e-5, name
        assert parity["first_divergent_module"]["module"] is None, name

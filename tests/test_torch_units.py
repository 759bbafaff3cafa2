"""Eager torch's own pieces, in this process: parity-tensor summaries made on the tensor's device
(torch_impl/summary.py) agree with the host's, and the canonical layout made there is the host's bit
for bit."""

import numpy as np
import pytest
import torch

from common.files.tensor_summary import summarize
from common.twin.correspond import derive
from tests.helpers import assert_summary_agrees_with_the_hosts, device_summary_case
from torch_impl.convert import to_canonical
from torch_impl.summary import canonical_on_device, device_summary, kept

# every kind of link: same, transpose, conv, conv_transpose, a declared rearrangement, a torch
# tensor packing three NNX ones (split) and three torch tensors packed into one NNX tensor (stacked)
TORCH = {
    "wte.weight": (50, 8),
    "ln.weight": (8,),
    "attn.c_attn.weight": (24, 8),
    "conv.weight": (4, 3, 5, 5),
    "up.weight": (4, 6, 3, 3),
    "heads.weight": (12, 8),
    "x.q_proj.weight": (8, 4),
    "x.k_proj.weight": (4, 4),
    "x.v_proj.weight": (4, 4),
}
NNX = {
    "wte.embedding": (50, 8),
    "ln.scale": (8,),
    "attn.q.kernel": (8, 8),
    "attn.k.kernel": (8, 8),
    "attn.v.kernel": (8, 8),
    "conv.kernel": (5, 5, 3, 4),
    "up.kernel": (3, 3, 4, 6),
    "heads.kernel": (8, 3, 4),
    "x.qkv.kernel": (4, 16),
}


def _correspondence():
    return derive(
        TORCH,
        NNX,
        packed={
            "attn.c_attn": ("attn.q", "attn.k", "attn.v"),
            "x.qkv": ("x.q_proj", "x.k_proj", "x.v_proj"),
        },
        layouts={"up.kernel": "conv_transpose", "heads.kernel": "(h d) e -> e h d"},
    )


def test_the_canonical_layout_made_on_the_device_is_the_hosts_bit_for_bit():
    corr = _correspondence()
    assert {link.layout for link in corr.links} >= {
        "same",
        "transpose",
        "conv",
        "conv_transpose",
        "(h d) e -> e h d",
    }
    torch.manual_seed(0)
    tensors = {k: torch.randn(s) for k, s in TORCH.items()}
    on_device, on_host = canonical_on_device(tensors, corr), to_canonical(tensors, corr)
    assert list(on_device) == list(on_host) == list(NNX)
    for name, value in on_device.items():
        assert isinstance(value, torch.Tensor) and np.array_equal(value.numpy(), on_host[name]), (
            name
        )


def test_a_0d_parameter_keeps_its_shape_through_the_canonical_layout_made_on_the_device():
    """CLIP's `logit_scale` under --tensors summary|auto: an empty permutation (a GPU run crashed on
    it)."""
    corr = derive(
        {"logit_scale": (), "proj.weight": (3, 2)}, {"logit_scale": (), "proj.kernel": (2, 3)}
    )
    tensors = {"logit_scale": torch.tensor(2.5), "proj.weight": torch.randn(3, 2)}
    on_device = canonical_on_device(tensors, corr)
    assert on_device["logit_scale"].shape == () and float(on_device["logit_scale"]) == 2.5
    assert np.array_equal(on_device["proj.kernel"].numpy(), tensors["proj.weight"].numpy().T)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_summary_made_on_the_device_agrees_with_the_hosts(dtype):
    name, host = device_summary_case()
    x = torch.from_numpy(host).to(dtype)
    assert_summary_agrees_with_the_hosts(
        device_summary(name, x), summarize(name, x.float().numpy())
    )
    assert device_summary("grads/empty", torch.zeros(0, 3)).stats["max_abs"] == 0.0


def test_a_group_is_summarized_on_its_accelerator_only_where_the_file_keeps_summaries():
    corr = derive(
        {"big.weight": (5000, 2), "small.weight": (3, 2)},
        {"big.kernel": (2, 5000), "small.kernel": (2, 3)},
    )
    tensors = {"big.weight": torch.randn(5000, 2), "small.weight": torch.randn(3, 2)}
    # CPU tensors: copied, and summarized by write_tensors in float64 on the host where they live
    assert isinstance(kept(tensors, corr, "params", "summary")["big.kernel"], np.ndarray)
    summarized = kept(tensors, corr, "params", "summary", on_device=True)  # as on an accelerator
    assert summarized["big.kernel"].on_device and summarized["big.kernel"].shape == (2, 5000)
    # small: kept whole
    assert np.array_equal(summarized["small.kernel"], tensors["small.weight"].numpy().T)
    # what compare's second pass asks whole: copied whole
    whole = kept(
        tensors, corr, "params", "summary", frozenset({"params/big.kernel"}), on_device=True
    )
    assert np.array_equal(whole["big.kernel"], tensors["big.weight"].numpy().T)
    assert np.array_equal(
        kept(tensors, corr, "params", "full")["big.kernel"], tensors["big.weight"].numpy().T
    )


def test_the_probe_reads_how_each_module_uses_its_matrix_and_finds_ties():
    """Hugging Face's GPT-2 as it ships: its Conv1D projections compute x @ W (in_out), the square
    c_proj too; an nn.Linear computes x @ W.T (out_in) even from a zero init; an embedding is not
    probed; the tied head is listed under the embedding's name."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from torch_impl.orientation import tied_names, weight_orientations

    config = GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=32, n_positions=8)
    gpt2 = GPT2LMHeadModel(config)
    found = weight_orientations(gpt2)
    for conv1d in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
        assert found[f"transformer.h.0.{conv1d}.weight"] == "in_out", conv1d
    assert "transformer.wte.weight" not in found and "transformer.wpe.weight" not in found
    assert tied_names(gpt2) == {"lm_head.weight": "transformer.wte.weight"}
    plain = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Embedding(10, 8))
    torch.nn.init.zeros_(plain[0].weight)
    assert weight_orientations(plain) == {"0.weight": "out_in"} and tied_names(plain) == {}


def test_a_model_loaded_in_bfloat16_is_built_as_hugging_face_builds_it():
    """train.bf16_mode=loaded builds the torch model under torch's bfloat16 default, as
    `from_pretrained(torch_dtype=torch.bfloat16)` does: Hugging Face's Llama gets bfloat16
    parameters while its rotary `inv_freq`, made in float32 on purpose, stays float32; the default
    is float32 again after; the forward is fed bfloat16 floats and its integer ids as they are."""
    from common.presets import load_spec
    from torch_impl.models import as_fed, build_model

    spec = load_spec(
        "",
        ["train.dtype=bfloat16", "train.bf16_mode=loaded"],
        twin="examples/llama/twin.py:llama_hf",
    )
    assert spec.train.loads_bfloat16 and spec.train.param_dtype == "bfloat16"
    model = build_model(spec.model, 0, spec.train.param_dtype)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    inv_freq = {n: b.dtype for n, b in model.named_buffers() if n.endswith("inv_freq")}
    assert inv_freq and set(inv_freq.values()) == {torch.float32}
    assert torch.get_default_dtype() == torch.float32
    fed = as_fed({"ids": torch.ones(2, 3, dtype=torch.int64), "x": torch.ones(2)}, spec.train)
    assert fed["ids"].dtype == torch.int64 and fed["x"].dtype == torch.bfloat16
    autocast = load_spec("gpt-tiny", ["train.dtype=bfloat16"]).train
    assert not autocast.loads_bfloat16 and autocast.param_dtype == "float32"
    assert as_fed(torch.ones(2), autocast).dtype == torch.float32

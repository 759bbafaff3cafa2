"""The derived parameter correspondence (common/twin/correspond.py) and twin definitions
(common/twin/): numpy only, no framework."""

import subprocess
import sys

import numpy as np
import pytest

from common.presets import load_spec
from common.spec import SpecError
from common.twin import BUILTIN, TwinError, hparams_of, load_twin, twin_of
from common.twin.correspond import CorrespondenceError, derive
from common.twin.modules import module_map, state_names
from common.weights import init_params, param_infos
from tests.helpers import REPO, process_env

TORCH_GPT_BLOCK = {  # nanoGPT-style names and torch layouts
    "wte.weight": (50, 8),
    "h.0.ln_1.weight": (8,),
    "h.0.ln_1.bias": (8,),
    "h.0.attn.c_attn.weight": (24, 8),
    "h.0.attn.c_attn.bias": (24,),
    "h.0.attn.c_proj.weight": (8, 8),
    "h.0.mlp.fc.weight": (32, 8),
    "conv.weight": (4, 3, 5, 5),
}
NNX_GPT_BLOCK = {
    "wte.embedding": (50, 8),
    "h.0.ln_1.scale": (8,),
    "h.0.ln_1.bias": (8,),
    "h.0.attn.q.kernel": (8, 8),
    "h.0.attn.k.kernel": (8, 8),
    "h.0.attn.v.kernel": (8, 8),
    "h.0.attn.q.bias": (8,),
    "h.0.attn.k.bias": (8,),
    "h.0.attn.v.bias": (8,),
    "h.0.attn.c_proj.kernel": (8, 8),
    "h.0.mlp.fc.kernel": (8, 32),
    "conv.kernel": (5, 5, 3, 4),
}
PACKED = {"attn.c_attn": ("attn.q", "attn.k", "attn.v")}


def test_layouts_and_packed_projection_round_trip_bitwise():
    corr = derive(TORCH_GPT_BLOCK, NNX_GPT_BLOCK, packed=PACKED)
    layouts = {link.torch: (link.canonical, link.layout) for link in corr.links}
    assert layouts["wte.weight"] == (("wte.embedding",), "same")
    assert layouts["h.0.ln_1.weight"] == (("h.0.ln_1.scale",), "same")
    assert layouts["h.0.attn.c_attn.weight"] == (
        ("h.0.attn.q.kernel", "h.0.attn.k.kernel", "h.0.attn.v.kernel"),
        "transpose",
    )
    assert layouts["conv.weight"] == (("conv.kernel",), "conv")
    rng = np.random.default_rng(0)
    torch_arrays = {
        k: rng.standard_normal(s).astype(np.float32) for k, s in TORCH_GPT_BLOCK.items()
    }
    canonical = corr.to_canonical(torch_arrays)
    assert np.array_equal(
        canonical["h.0.attn.k.kernel"], torch_arrays["h.0.attn.c_attn.weight"][8:16].T
    )
    assert np.array_equal(
        canonical["conv.kernel"], torch_arrays["conv.weight"].transpose(2, 3, 1, 0)
    )
    specs = corr.torch_partition_specs(
        {
            **{n: (None,) * len(v) for n, v in NNX_GPT_BLOCK.items()},
            "conv.kernel": (None, None, "fsdp", "tensor"),
            "h.0.mlp.fc.kernel": (None, "tensor"),
        }
    )
    assert specs["conv.weight"] == ("tensor", "fsdp", None, None)  # HWIO -> OIHW
    assert specs["h.0.mlp.fc.weight"] == ("tensor", None)  # (in, out) -> (out, in)
    back = corr.to_torch(canonical)
    assert all(np.array_equal(back[k], v) for k, v in torch_arrays.items())


def test_unequal_packed_parts_split_by_the_nnx_shapes():
    """Grouped-query attention packs a wide q with narrow k and v."""
    corr = derive(
        {"attn.qkv.weight": (16, 8)},
        {"attn.q.kernel": (8, 8), "attn.k.kernel": (8, 4), "attn.v.kernel": (8, 4)},
        packed={"attn.qkv": ("attn.q", "attn.k", "attn.v")},
    )
    value = np.arange(128, dtype=np.float32).reshape(16, 8)
    canonical = corr.to_canonical({"attn.qkv.weight": value})
    assert np.array_equal(canonical["attn.v.kernel"], value[12:].T)


TORCH_GQA = {
    "layers.0.self_attn.q_proj.weight": (8, 4),
    "layers.0.self_attn.q_proj.bias": (8,),
    "layers.0.self_attn.k_proj.weight": (4, 4),
    "layers.0.self_attn.k_proj.bias": (4,),
    "layers.0.self_attn.v_proj.weight": (4, 4),
    "layers.0.self_attn.v_proj.bias": (4,),
    "layers.0.self_attn.o_proj.weight": (4, 8),
}
NNX_FUSED = {
    "layers.0.attn.qkv.kernel": (4, 16),
    "layers.0.attn.qkv.bias": (16,),
    "layers.0.attn.o_proj.kernel": (8, 4),
}
# the NNX module packs torch's three
FUSED = {"attn.qkv": ("attn.q_proj", "attn.k_proj", "attn.v_proj")}


def test_packed_on_the_nnx_side_stacks_the_torch_tensors_into_its_columns():
    """An NNX port that fuses q/k/v (the usual JAX style) against torch's separate projections
    (Hugging Face's Qwen2, grouped-query: q wider than k and v): `packed` keyed by the NNX
    module."""
    corr = derive(TORCH_GQA, NNX_FUSED, packed=FUSED, rename={r"\.self_attn\.": ".attn."})
    rows = {link.torch: (link.canonical, link.layout, link.rows) for link in corr.links}
    assert rows["layers.0.self_attn.k_proj.weight"] == (
        ("layers.0.attn.qkv.kernel",),
        "transpose",
        (8, 12),
    )
    assert rows["layers.0.self_attn.v_proj.bias"] == (("layers.0.attn.qkv.bias",), "same", (12, 16))
    assert list(rows) == list(TORCH_GQA)  # torch's order
    rng = np.random.default_rng(0)
    torch_arrays = {k: rng.standard_normal(s).astype(np.float32) for k, s in TORCH_GQA.items()}
    canonical = corr.to_canonical(torch_arrays)
    q, k, v = (torch_arrays[f"layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
    assert np.array_equal(
        canonical["layers.0.attn.qkv.kernel"], np.concatenate([q.T, k.T, v.T], axis=1)
    )
    assert np.array_equal(
        canonical["layers.0.attn.qkv.bias"][8:12], torch_arrays["layers.0.self_attn.k_proj.bias"]
    )
    back = corr.to_torch(canonical)
    assert all(np.array_equal(back[k], v) for k, v in torch_arrays.items())
    specs = corr.torch_partition_specs(
        {n: (None, "tensor")[-len(s) :] for n, s in NNX_FUSED.items()}
    )
    assert specs["layers.0.self_attn.q_proj.weight"] == ("tensor", None)


def test_nnx_side_packed_that_does_not_fit_is_refused_naming_the_tensors():
    wrong_order = {"attn.qkv": ("attn.q_proj", "attn.k_proj", "attn.w_proj")}
    with pytest.raises(
        CorrespondenceError,
        match=r"NNX layers.0.attn.qkv.kernel \[4, 16\] packs torch modules, "
        r"but the torch model has no layers.0.attn.w_proj.weight",
    ):
        derive(TORCH_GQA, NNX_FUSED, packed=wrong_order, rename={r"\.self_attn\.": ".attn."})
    narrow = {**NNX_FUSED, "layers.0.attn.qkv.kernel": (4, 12)}
    with pytest.raises(
        CorrespondenceError, match=r"is not the torch tensors .*stacked along their first axis"
    ):
        derive(TORCH_GQA, narrow, packed=FUSED, rename={r"\.self_attn\.": ".attn."})


def test_rename_and_normalised_names():
    corr = derive(
        {"layers.0.self_attn.q_proj.weight": (4, 6), "Final_Norm.weight": (6,)},
        {"layers.0.attn.q_proj.kernel": (6, 4), "finalnorm.scale": (6,)},
        rename={r"\.self_attn\.": ".attn."},
    )
    assert [(link.torch, link.canonical[0]) for link in corr.links] == [
        ("layers.0.self_attn.q_proj.weight", "layers.0.attn.q_proj.kernel"),
        ("Final_Norm.weight", "finalnorm.scale"),
    ]
    assert module_map(
        ["", "layers.0.self_attn", "layers.0.self_attn.q_proj", "layers.0.dropout"],
        {"layers.0.attn.q_proj.kernel": (6, 4)},
        {r"\.self_attn\.": ".attn."},
    ) == {
        "": "(model)",
        "layers.0.self_attn": "layers.0.attn",
        "layers.0.self_attn.q_proj": "layers.0.attn.q_proj",
    }


def test_unmatched_tensors_of_both_sides_are_all_listed_with_shapes_and_closest():
    torch_side = {
        "embed.weight": (50, 8),
        "blocks.0.attn.wq.weight": (8, 8),
        "blocks.0.attn.wk.weight": (8, 8),
        "blocks.0.norm.weight": (8,),
        "head.weight": (50, 8),
    }
    nnx_side = {
        "embed.embedding": (50, 8),
        "blocks.0.attn.query.kernel": (8, 8),
        "blocks.0.attn.key.kernel": (8, 8),
        "blocks.0.norm.scale": (8,),
        "head.kernel": (8, 60),
    }
    with pytest.raises(CorrespondenceError) as caught:
        derive(torch_side, nnx_side)
    message = str(caught.value)
    # one line, exit 2 in the CLIs
    assert "\n" not in message and isinstance(caught.value, SpecError)
    assert "torch has 3 unmatched" in message and "NNX has 3 unmatched" in message
    for item in (
        "blocks.0.attn.wq.weight [8, 8]",
        "blocks.0.attn.wk.weight [8, 8]",
        "head.weight [50, 8]",
        "blocks.0.attn.query.kernel [8, 8]",
        "blocks.0.attn.key.kernel [8, 8]",
        "head.kernel [8, 60]",
    ):
        assert item in message, item
    assert (
        "head.weight [50, 8] (shape differs from head.kernel [8, 60] under the layout "
        "'transpose', which asks torch for [60, 8])" in message
    )
    assert "blocks.0.attn.wq.weight [8, 8] (closest blocks.0.attn.query.kernel [8, 8])" in message


def test_a_weights_closest_candidate_is_never_a_bias_of_its_shape():
    """torchvision's index names against a port's own: a BatchNorm weight of 16 was offered an SE
    convolution's bias of 16, the name most alike among the tensors of its shape."""
    with pytest.raises(CorrespondenceError) as caught:
        derive(
            {"features.0.1.weight": (16,), "features.0.1.bias": (16,)},
            {"blocks.0.se.fc2.bias": (16,), "stem.bn.scale": (16,)},
        )
    assert "features.0.1.weight [16] (closest stem.bn.scale [16])" in str(caught.value)
    assert "features.0.1.bias [16] (closest blocks.0.se.fc2.bias [16])" in str(caught.value)


def test_a_kernels_closest_candidates_are_a_transposed_weight_and_a_reshaped_table():
    """A new user's Swin: an NNX Linear kernel of (16, 64) was offered another Linear's (16, 64)
    weight (its own is (64, 16)), and a relative position table of (2, 7, 7) a bias of (32,) when
    one of 98 was left."""
    with pytest.raises(CorrespondenceError) as caught:
        derive(
            {
                "features.1.0.mlp.0.weight": (64, 16),
                "features.1.0.mlp.3.weight": (16, 64),
                "features.1.0.attn.relative_position_bias_table": (49, 2),
                "features.3.0.attn.proj.bias": (32,),
            },
            {
                "stages.0.blocks.0.mlp.fc1.kernel": (16, 64),
                "stages.0.blocks.0.mlp.fc2.kernel": (64, 16),
                "stages.0.blocks.0.attn.rel_bias": (2, 7, 7),
                "stages.1.blocks.0.attn.proj.bias": (32,),
            },
        )
    message = str(caught.value)
    assert (
        "stages.0.blocks.0.mlp.fc1.kernel [16, 64] (closest features.1.0.mlp.0.weight [64, 16])"
        in message
    )
    assert (
        "stages.0.blocks.0.mlp.fc2.kernel [64, 16] (closest features.1.0.mlp.3.weight [16, 64])"
        in message
    )
    assert (
        "stages.0.blocks.0.attn.rel_bias [2, 7, 7] (closest "
        "features.1.0.attn.relative_position_bias_table "
        "[49, 2])" in message
    )


@pytest.mark.parametrize("preset", ["gpt-tiny", "mlp-tiny", "cnn-digits"])
def test_builtin_models_are_twins(preset):
    spec = load_spec(preset).model
    twin = BUILTIN[spec.family]
    assert twin.torch == f"torch_impl.models:{spec.family}" and twin.init == "canonical"
    hparams = hparams_of(spec)  # the factories take the spec's fields, family aside
    assert "family" not in hparams and all(hparams[k] == getattr(spec, k) for k in hparams)
    assert twin_of(spec) is twin and twin.nnx == f"jax_impl.models:{spec.family}"
    assert (twin.packed, twin.hf) == (
        ({"attn.qkv": ("attn.q", "attn.k", "attn.v")}, {"model_type": "gpt2"})
        if spec.family == "gpt"
        else ({}, {})
    )
    assert set(init_params(spec, 0)) == set(param_infos(spec))


def test_twin_references_that_do_not_load(tmp_path):
    (tmp_path / "twins.py").write_text(
        "from common.twin import Twin\nnot_a_twin = 3\nt = Twin(torch='m.py:A', nnx='m.py:B')\n"
    )
    (tmp_path / "heavy.py").write_text(
        "import torch\nfrom common.twin import Twin\nt = Twin(torch='m.py:A', nnx='m.py:B')\n"
    )
    cases = [
        (f"{tmp_path}/missing.py:t", "file .*missing.py does not exist"),
        (f"{tmp_path}/twins.py:nope", "has no 'nope'"),
        (f"{tmp_path}/twins.py:not_a_twin", "is a int, not a common.twin.Twin"),
        (f"{tmp_path}/twins.py", "must look like path/to/file.py:name"),
    ]
    for ref, message in cases:
        with pytest.raises(TwinError, match=message):
            load_twin(ref, frameworks_allowed=False)
    assert load_twin(f"{tmp_path}/twins.py:t").base_dir == str(tmp_path)
    # in a fresh interpreter, as compare's (this one may have imported torch already)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from common.twin import load_twin; "
            f"load_twin({str(tmp_path / 'heavy.py') + ':t'!r}, frameworks_allowed=False)",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=process_env(),
    )
    assert proc.returncode == 1
    assert "loading it imported torch; keep framework code in the factory modules" in proc.stderr


@pytest.mark.error_case("twin-set-unknown")
def test_set_reaches_a_twins_hyperparameters_with_their_types():
    spec = load_spec(
        "",
        ["model.n_layers=3", "model.rope_theta=500000", "train.steps=4"],
        twin="examples/llama/twin.py:llama_tiny",
    )
    assert spec.model.hparams["n_layers"] == 3 and spec.model.hparams["rope_theta"] == 500000.0
    assert spec.model.vocab_size == 256 and spec.seq_len == 64 and spec.train.steps == 4
    with pytest.raises(SpecError, match="has no hyperparameter 'n_layer'"):
        load_spec("", ["model.n_layer=3"], twin="examples/llama/twin.py:llama_tiny")
    with pytest.raises(SpecError, match="model.n_layers=x must be an integer"):
        load_spec("", ["model.n_layers=x"], twin="examples/llama/twin.py:llama_tiny")


def test_nnx_sequential_levels_and_batchnorm_statistics_correspond():
    """torchvision's `downsample.0`/`.1` meet nnx.Sequential's `downsample.layers.0`/`.1`;
    BatchNorm's running statistics get their NNX names and the torch-only count none."""
    torch_params = {
        "layer1.0.conv1.weight": (16, 16, 3, 3),
        "layer1.0.downsample.0.weight": (16, 16, 1, 1),
        "layer1.0.downsample.1.weight": (16,),
        "layer1.0.downsample.1.bias": (16,),
    }
    canonical = {
        "layer1.layers.0.conv1.kernel": (3, 3, 16, 16),
        "layer1.layers.0.downsample.layers.0.kernel": (1, 1, 16, 16),
        "layer1.layers.0.downsample.layers.1.scale": (16,),
        "layer1.layers.0.downsample.layers.1.bias": (16,),
    }
    links = {
        link.torch: (link.canonical, link.layout) for link in derive(torch_params, canonical).links
    }
    assert links["layer1.0.downsample.0.weight"] == (
        ("layer1.layers.0.downsample.layers.0.kernel",),
        "conv",
    )
    assert links["layer1.0.downsample.1.weight"] == (
        ("layer1.layers.0.downsample.layers.1.scale",),
        "same",
    )
    modules = module_map(
        ["", "layer1", "layer1.0", "layer1.0.downsample", "layer1.0.downsample.1"], canonical
    )
    assert modules["layer1.0.downsample.1"] == "layer1.layers.0.downsample.layers.1"
    buffers = [
        "layer1.0.downsample.1.running_mean",
        "layer1.0.downsample.1.running_var",
        "layer1.0.downsample.1.num_batches_tracked",
    ]
    assert state_names(buffers, modules) == {
        "layer1.0.downsample.1.running_mean": "layer1.layers.0.downsample.layers.1.mean",
        "layer1.0.downsample.1.running_var": "layer1.layers.0.downsample.layers.1.var",
    }


def test_an_unmatched_tree_is_summarised_first_with_the_rename_that_fixes_it():
    """20 layers whose attention is `wq` on one side and `query` on the other: one rename, said
    first; the detail lists 12 per side, not all (a 5,000-character line helps nobody)."""
    torch_side = {f"blocks.{i}.attn.wq.weight": (8, 4) for i in range(20)}
    nnx_side = {f"blocks.{i}.attn.query.kernel": (4, 8) for i in range(20)}
    with pytest.raises(CorrespondenceError) as caught:
        derive(torch_side, nnx_side)
    message = str(caught.value)
    assert message.startswith(
        "the torch and NNX parameter trees do not correspond (rename {r'(^|\\.)wq\\.': "
        "r'\\1query.'} in the twin would match all 20): torch has 20 unmatched ["
    )
    assert "; ... and 8 more]" in message and len(message) < 2500
    # transposed
    assert "blocks.0.attn.wq.weight [8, 4] (closest blocks.0.attn.query.kernel [4, 8])" in message
    # the hint works
    assert len(derive(torch_side, nnx_side, rename={r"(^|\.)wq\.": r"\1query."}).links) == 20


def test_a_class_given_as_its_own_factory_is_told_which_keywords_it_is_called_with():
    """torchvision's MobileNetV3 class as a twin's torch factory: it takes no `input_shape`; the
    one-line error says what the factory is called with and what to give instead."""
    from common.twin import factory_error

    class MobileNetV3:  # as torchvision's: its own constructor's arguments
        def __init__(self, inverted_residual_setting, last_channel, num_classes=1000):
            pass

    kwargs = {"input_shape": (3, 32, 32), "num_classes": 10}
    try:
        MobileNetV3(**kwargs)
    except TypeError as e:
        error = factory_error("torch factory", "models.py:MobileNetV3", e, kwargs)
    assert str(error) == (
        "torch factory models.py:MobileNetV3 raised TypeError: "
        "test_a_class_given_as_its_own_factory_is_told_which_keywords_it_is_called_with.<locals>."
        "MobileNetV3.__init__() got an unexpected keyword argument 'input_shape' (it is called "
        "with the keywords input_shape, num_classes: give a function that takes them and builds "
        "the model)"
    )
    other = factory_error(
        "NNX factory", "m.py:f", ValueError("hidden must be even"), ["hidden", "rngs"]
    )
    # no hint where none helps
    assert str(other) == "NNX factory m.py:f raised ValueError: hidden must be even"


def test_a_layer_scale_of_another_shape_is_refused_and_declared_with_unit_axes():
    """torchvision ConvNeXt's layer scale (dim, 1, 1) against a port's (dim,): refused, each side
    naming its twin (not the closest shape of another block) and the declaration that fixes it; `d 1
    1 -> d` then links them, bit for bit both ways."""
    torch_params = {"features.1.0.layer_scale": (16, 1, 1), "features.3.0.layer_scale": (32, 1, 1)}
    canonical = {"stages.0.gamma": (16,), "stages.1.gamma": (32,)}
    rename = {
        r"^features\.1\.0\.": "stages.0.",
        r"^features\.3\.0\.": "stages.1.",
        r"\.layer_scale$": ".gamma",
    }
    with pytest.raises(CorrespondenceError) as refused:
        derive(torch_params, canonical, rename=rename)
    assert (
        "NNX has 2 unmatched [stages.0.gamma [16] (shape differs from features.1.0.layer_scale "
        "[16, 1, 1]); "
        "stages.1.gamma [32] (shape differs from features.3.0.layer_scale [32, 1, 1])]"
        in str(refused.value)
    )
    assert str(refused.value).endswith(
        "a tensor whose shape alone differs needs its layout declared "
        "(layouts={regex: 'A -> B'}, e.g. 'd 1 1 -> d')"
    )
    corr = derive(
        torch_params, canonical, rename=rename, layouts={n: "d 1 1 -> d" for n in canonical}
    )
    arrays = {
        k: np.random.default_rng(0).standard_normal(s).astype(np.float32)
        for k, s in torch_params.items()
    }
    ported = corr.to_canonical(arrays)
    assert np.array_equal(ported["stages.1.gamma"], arrays["features.3.0.layer_scale"].reshape(32))
    assert all(np.array_equal(corr.to_torch(ported)[k], v) for k, v in arrays.items())


def test_a_probed_orientation_decides_a_kernels_transpose_square_or_not():
    """How the torch module uses its weight (the describe step's probe) decides the layout, even
    where the shapes cannot: HF's Conv1D (in, out) is the kernel as it is, nn.Linear transposed;
    without a probe the leaf rule transposes."""
    torch_side = {"attn.c_attn.weight": (8, 24), "attn.c_proj.weight": (8, 8), "fc.weight": (8, 8)}
    nnx_side = {"attn.c_attn.kernel": (8, 24), "attn.c_proj.kernel": (8, 8), "fc.kernel": (8, 8)}
    probed = {"attn.c_attn.weight": "in_out", "attn.c_proj.weight": "in_out"}
    corr = derive(torch_side, nnx_side, torch_orientations=probed)
    layouts = {link.torch: link.layout for link in corr.links}
    assert layouts == {
        "attn.c_attn.weight": "same",
        "attn.c_proj.weight": "same",
        "fc.weight": "transpose",
    }
    assert corr.decided == {"attn.c_attn.kernel": "same", "attn.c_proj.kernel": "same"}
    # a probe that agrees with the leaf's rule changes nothing, and is not carried to the backends
    probed["fc.weight"] = "out_in"
    corr = derive(torch_side, nnx_side, torch_orientations=probed)
    assert "fc.kernel" not in corr.decided
    assert {link.torch: link.layout for link in corr.links}["fc.weight"] == "transpose"


def test_a_tensor_a_tie_leaves_unmatched_names_the_tie():
    torch_side = {"transformer.wte.weight": (50, 8)}
    nnx_side = {"wte.embedding": (50, 8), "lm_head.kernel": (8, 50)}
    with pytest.raises(CorrespondenceError) as raised:
        derive(
            torch_side,
            nnx_side,
            rename={r"^transformer\.": ""},
            torch_ties={"lm_head.weight": "transformer.wte.weight"},
        )
    assert (
        "lm_head.kernel [8, 50] (torch's lm_head.weight is transformer.wte.weight: tied, one "
        "tensor;" in str(raised.value)
    )

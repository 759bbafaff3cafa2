"""A located module's other arguments (compare/judge/extra_inputs.py), in this process: arrays of
one key and shape compared as they are; routing passed as (indices, weights) on one side and as a
dense (tokens, experts) matrix on the other compared as dense weights; a difference there moves the
location to the module that passed them."""

import numpy as np

from common.twin.modules import ROOT_MODULE
from compare.judge.extra_inputs import (
    ROUTING,
    compare_extra_inputs,
    entered_words,
    with_extra_inputs,
)

BOUNDS = {"atol": 1e-5, "rtol": 1e-4}
NAMES = ("jax", "torch")


def _sides(scale_dense: float = 1.0):
    rng = np.random.default_rng(0)
    # (tokens, k)
    indices = np.stack([rng.choice(4, 2, replace=False) for _ in range(6)]).astype(np.float32)
    weights = rng.random((6, 2)).astype(np.float32)
    weights /= weights.sum(-1, keepdims=True)
    dense = np.zeros((6, 4), np.float32)
    np.put_along_axis(dense, indices.astype(int), weights, axis=1)
    hidden = rng.standard_normal((6, 8)).astype(np.float32)
    # the port's dense dispatch
    port = {"moe.experts:in": hidden, "moe.experts:in#1": dense * scale_dense}
    # HF's experts
    hf = {"moe.experts:in": hidden, "moe.experts:in#1": indices, "moe.experts:in#2": weights}
    return port, hf


def test_routing_as_indices_and_weights_is_compared_with_a_dense_matrix():
    port, hf = _sides()
    found = compare_extra_inputs(port, hf, "moe.experts", BOUNDS, NAMES)
    assert list(found) == [ROUTING] and found[ROUTING]["within"] and found[ROUTING]["abs"] == 0
    located = {"module": "moe.experts", "input_agrees": True, "inputs_not_compared": 2}
    with_extra_inputs(located, port, hf, BOUNDS, NAMES)
    assert located == {"module": "moe.experts", "input_agrees": True, "inputs_not_compared": 0}


def test_routing_weights_that_differ_move_the_location_to_the_module_that_passed_them():
    port, hf = _sides(scale_dense=1.3)  # weights not renormalised, say
    located = {"module": "layers.0.moe.experts", "input_agrees": True, "inputs_not_compared": 2}
    block = {"layers.0.moe": np.ones(2)}  # the block's own capture: it is called
    with_extra_inputs(
        located,
        {**block, **{k.replace("moe", "layers.0.moe"): v for k, v in port.items()}},
        {**block, **{k.replace("moe", "layers.0.moe"): v for k, v in hf.items()}},
        BOUNDS,
        NAMES,
    )
    assert located["module"] == "layers.0.moe"
    assert located["entered_through"]["module"] == "layers.0.moe.experts"
    assert (
        located["entered_through"]["what"] == ROUTING
        and not located["entered_through"]["error"]["within"]
    )


def test_arguments_of_one_key_and_shape_are_compared_as_they_are_and_none_kept_is_none():
    a = {"m:in": np.ones(3), "m:in#mask": np.ones(3)}
    b = {"m:in": np.ones(3), "m:in#mask": np.zeros(3)}
    found = compare_extra_inputs(a, b, "m", BOUNDS, NAMES)
    assert list(found) == ["argument `mask`"] and not found["argument `mask`"]["within"]
    assert compare_extra_inputs(a, {"m:in": np.ones(3)}, "m", BOUNDS, NAMES) is None
    # another kind of number under one key (a boolean mask, an additive one) is not like for like
    boolean = {"m:in": np.ones(3), "m:in#mask": np.array([True, False, True])}
    assert compare_extra_inputs(a, boolean, "m", BOUNDS, NAMES) is None


def test_hugging_faces_experts_signature_weights_not_renormalised_name_the_moe_block():
    """experts(hidden, top_k_index, top_k_weights) on both sides, as HF calls them: the indices
    (int64 on torch, int32 on JAX) agree, the weights differ: the block that made them is named,
    saying the 3rd argument."""
    port, hf = _sides()
    indices, weights = hf["moe.experts:in#1"], hf["moe.experts:in#2"]
    jax_side = {
        "layers.0.moe": np.ones(2),  # the block's own capture: the caller of its experts
        "layers.0.moe.experts:in": hf["moe.experts:in"],
        "layers.0.moe.experts:in#1": indices.astype(np.int32),
        "layers.0.moe.experts:in#2": weights,
    }
    torch_side = {
        **jax_side,
        "layers.0.moe.experts:in#1": indices.astype(np.int64),
        "layers.0.moe.experts:in#2": weights * 1.03,
    }
    located = {"module": "layers.0.moe.experts", "input_agrees": True, "inputs_not_compared": 2}
    with_extra_inputs(located, jax_side, torch_side, BOUNDS, NAMES)
    assert located["module"] == "layers.0.moe" and located["inputs_not_compared"] == 0
    via = located["entered_through"]
    assert (via["module"], via["what"]) == ("layers.0.moe.experts", "3rd argument")
    assert not via["error"]["within"] and 0.02 < via["error"]["rel"] < 0.04
    assert entered_words(via) == "the 3rd argument it passes to layers.0.moe.experts differs"


def test_a_differing_argument_its_caller_was_passed_too_is_located_where_it_was_made():
    """A mask made by the model and passed down through each layer to its attention: the layer was
    passed it too, so the location climbs past it (and past `layers`, a list that is no call) to the
    model; one mask convention (-inf against the dtype's minimum) is no difference."""
    x = np.ones((2, 4))
    causal = np.triu(np.full((4, 4), -np.inf), 1)
    ours = {"layers.0": x, "layers.0:in#1": causal, "layers.0.attn:in": x}
    ours["layers.0.attn:in#1"] = causal
    convention = np.where(np.isinf(causal), np.finfo(np.float32).min, 0.0)
    theirs = {**ours, "layers.0:in#1": convention, "layers.0.attn:in#1": convention}
    located = {"module": "layers.0.attn", "input_agrees": True, "inputs_not_compared": 1}
    with_extra_inputs(located, ours, theirs, BOUNDS, NAMES)
    assert located["module"] == "layers.0.attn" and "entered_through" not in located
    off_by_one = np.triu(np.full((4, 4), -np.inf), 2)  # the diagonal's neighbour left unmasked
    wrong = {**ours, "layers.0:in#1": off_by_one, "layers.0.attn:in#1": off_by_one}
    located = {"module": "layers.0.attn", "input_agrees": True, "inputs_not_compared": 1}
    with_extra_inputs(located, ours, wrong, BOUNDS, NAMES)
    assert located["module"] == ROOT_MODULE
    assert located["entered_through"]["module"] == "layers.0.attn"
    assert located["entered_through"]["what"] == "2nd argument"

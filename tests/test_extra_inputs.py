"""A located module's other arguments (compare/judge/extra_inputs.py), in this process: arrays of
one key and shape compared as they are; routing passed as (indices, weights) on one side and as a
dense (tokens, experts) matrix on the other compared as dense weights; a difference there moves the
location to the module that passed them."""

import numpy as np

from compare.judge.extra_inputs import ROUTING, compare_extra_inputs, with_extra_inputs

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
    with_extra_inputs(
        located,
        {k.replace("moe", "layers.0.moe"): v for k, v in port.items()},
        {k.replace("moe", "layers.0.moe"): v for k, v in hf.items()},
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
    assert list(found) == ["mask"] and not found["mask"]["within"]
    assert compare_extra_inputs(a, {"m:in": np.ones(3)}, "m", BOUNDS, NAMES) is None
    # one key may hold one value in two conventions (a boolean mask, an additive one): said, the
    # location kept
    located = {"module": "m", "input_agrees": True, "inputs_not_compared": 1}
    with_extra_inputs(located, a, b, BOUNDS, NAMES)
    assert located["module"] == "m" and located["other_input_differs"]["what"] == "mask"
    assert "entered_through" not in located and located["inputs_not_compared"] == 0

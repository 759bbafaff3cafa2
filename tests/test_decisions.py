"""Step-0 decisions (common/capture/decisions.py) in this process: each side's capture records its
top-k, argmax and sort calls with the module they ran in; the torch side takes another side's
choices when told to, its values gathered so gradients flow; compare tells flips at ties from a
port's difference, and what each does to the verdict (compare/judge/decided.py). The end-to-end runs
on Mixtral are in tests/test_example_mixtral.py."""

import numpy as np
import pytest

from common.capture.decisions import Decision, compare_decisions, margins, oriented
from compare.judge.decided import NOT_JUDGED, decisions_cell, judge_decisions, needs_imposing

BOUND = {"atol": 1e-5, "rtol": 1e-4}


def _topk(scores: np.ndarray, k: int, module="layers.0.moe", ties_low_first=True) -> Decision:
    order = (
        np.argsort(-scores, axis=-1, kind="stable")
        if ties_low_first
        else scores.shape[-1] - 1 - np.argsort(-scores[..., ::-1], axis=-1, kind="stable")
    )
    return Decision(module, "topk", order[..., :k].astype(np.int64), scores)


def test_an_exact_tie_broken_otherwise_is_a_flip_within_rounding_with_a_zero_margin():
    # a zero-initialised router's softmax: every expert ties
    scores = np.full((6, 4), 0.25, np.float32)
    ref, other = _topk(scores, 2), _topk(scores, 2, "layers.0.moe.router", ties_low_first=False)
    found = compare_decisions([ref], [other], **BOUND)
    assert found["flipped"] == 6 and found["ties_only"] and found["first_not_a_tie"] is None
    first = found["first"]
    assert (first["module"], first["other_module"], first["rows"], first["widest_margin"]) == (
        "layers.0.moe",
        "layers.0.moe.router",
        6,
        0.0,
    )
    assert "every flip within rounding of a tie" in decisions_cell({"decisions": found})


def test_a_tie_is_judged_on_each_sides_own_scores_logits_against_softmax():
    # a zero router: the port ranks its logits, torch their softmax
    logits = np.zeros((3, 4), np.float32)
    found = compare_decisions(
        [_topk(logits, 2)],
        [_topk(np.full((3, 4), 0.25, np.float32), 2, ties_low_first=False)],
        **BOUND,
    )
    assert found["flipped"] == 3 and found["ties_only"] and found["first"]["scores_max_abs"] == 0.25


def test_a_flip_whose_margin_is_wider_than_the_bound_is_not_a_tie():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(8, 4)).astype(np.float32)
    moved = scores.copy()
    moved[3] = moved[3, ::-1]  # one row ranked on other values: a port that ranks something else
    found = compare_decisions([_topk(scores, 2)], [_topk(moved, 2)], **BOUND)
    assert found["flipped"] == 1 and not found["ties_only"]
    assert found["first_not_a_tie"]["widest_margin"] > found["first_not_a_tie"]["bound"]


def test_choices_of_top_k_are_sets_and_of_a_sort_orders_and_unmatched_calls_are_said():
    scores = np.array([[3.0, 2.0, 1.0]], np.float32)
    a = Decision("m", "topk", np.array([[0, 1]]), scores)
    assert (
        compare_decisions([a], [Decision("m", "topk", np.array([[1, 0]]), scores)], **BOUND)[
            "flipped"
        ]
        == 0
    )
    s = Decision("m", "argsort", np.array([[0, 1, 2]]), scores)
    assert (
        compare_decisions([s], [Decision("m", "argsort", np.array([[1, 0, 2]]), scores)], **BOUND)[
            "flipped"
        ]
        == 1
    )
    assert margins(s).tolist() == [1.0]
    unmatched = compare_decisions([a], [], **BOUND)
    assert not unmatched["matched"] and "made 1 and 0 decisions" in unmatched["why"]
    assert compare_decisions([], [], **BOUND) is None


def test_argmin_and_ascending_orders_are_kept_larger_first_with_a_k_axis():
    indices, scores = oriented(
        np.array([2, 0]), np.array([[3.0, 1.0, 0.5], [0.0, 2.0, 4.0]]), 1, smallest=True
    )
    assert indices.tolist() == [[2], [0]] and scores.tolist() == [
        [-3.0, -1.0, -0.5],
        [0.0, -2.0, -4.0],
    ]


def _parity(**more) -> dict:
    return {
        "comparable": True,
        "passed": False,
        "first_divergent_module": None,
        "first_divergent_module_backward": None,
        **more,
    }


def _sides(ref: Decision, other: Decision, imposed=None):
    def tensors(d):
        return {
            "decisions": {"0.indices": d.indices, "0.scores": d.scores},
            "decisions_facts": [{"module": d.module, "op": d.op, "k": d.indices.shape[-1]}],
        }

    other_tensors = {**tensors(other), **({"imposed": imposed} if imposed is not None else {})}
    return tensors(ref), other_tensors


def test_ties_only_decide_by_the_capture_with_the_reference_choices_imposed():
    scores = np.full((4, 4), 0.25, np.float32)
    ref, other = _sides(_topk(scores, 2), _topk(scores, 2, ties_low_first=False))
    passing = _parity(passed=True)
    # flips that moved no tensor: nothing to impose
    judge_decisions(passing, ref, other, BOUND, locate=None)
    assert (
        passing["passed"]
        and not needs_imposing(passing)
        and "within its bound all the same" in decisions_cell(passing)
    )
    parity = _parity(
        first_divergent_module={"module": "layers.0.moe.experts", "input_agrees": True}
    )
    judge_decisions(parity, ref, other, BOUND, locate=None)
    # not yet imposed: no module is blamed for the flips, the pair does not pass, compare runs the
    # imposed capture
    assert (
        parity["first_divergent_module"] is None and not parity["passed"] and needs_imposing(parity)
    )
    assert "not checked with the reference's choices imposed" in decisions_cell(parity)

    agreeing = ({"module": None, "modules_compared": 26}, {"module": None})
    ref, other = _sides(
        _topk(scores, 2), _topk(scores, 2, ties_low_first=False), imposed={"activations": {"x": 1}}
    )
    parity = _parity()
    judge_decisions(parity, ref, other, BOUND, locate=lambda a, b: agreeing)
    assert parity["passed"] and parity["not_judged"] == NOT_JUDGED and not needs_imposing(parity)
    assert "every module and its gradient agree (26 modules)" in decisions_cell(parity)

    parity = _parity()
    judge_decisions(
        parity, ref, other, BOUND, locate=lambda a, b: ({"module": "layers.0.moe.experts"}, None)
    )
    assert (
        not parity["passed"]
        and parity["first_divergent_module"]["module"] == "layers.0.moe.experts"
    )


def test_a_real_flip_is_located_where_it_ranks_unless_a_module_parts_before_it():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(4, 4)).astype(np.float32)
    ref, other = _sides(_topk(scores, 2, "layers.1.moe"), _topk(-scores, 2, "layers.1.moe.router"))
    ref["activations"] = dict.fromkeys(
        ["layers.0.moe.experts:in", "layers.0.moe.experts", "layers.1.moe:in"]
    )
    upstream = {"module": "layers.0.moe.experts", "input_agrees": True, "modules_compared": 26}
    parity = _parity(first_divergent_module=dict(upstream))
    judge_decisions(parity, ref, other, BOUND, locate=None)
    assert (
        parity["first_divergent_module"] == upstream
        and parity["decisions"]["after"] == "layers.0.moe.experts"
    )

    parity = _parity(
        first_divergent_module={
            "module": "layers.1.moe.experts",
            "input_agrees": True,
            "modules_compared": 26,
            "modules_diverging": 3,
        }
    )
    ref["activations"] = dict.fromkeys(["layers.1.moe:in", "layers.1.moe.experts:in"])
    judge_decisions(parity, ref, other, BOUND, locate=None)
    found = parity["first_divergent_module"]
    assert (
        found["module"] == "layers.1.moe"
        and found["decision"]["flipped"] >= 1
        and not parity["passed"]
    )


def test_torch_records_top_k_and_argmax_and_imposes_another_sides_choice_with_gradients():
    torch = pytest.importorskip("torch")
    from torch_impl.decisions import DecisionWatch

    scores = torch.tensor([[0.1, 0.7, 0.2, 0.7], [0.5, 0.1, 0.3, 0.0]], requires_grad=True)
    watch = DecisionWatch(lambda: "router", lambda t: t.float().numpy())
    with watch:
        values, indices = torch.topk(scores, 2)
        best = scores.argmax(dim=-1)
    made = watch.decisions()
    assert [d.op for d in made] == ["topk", "argmax"] and made[0].module == "router"
    assert made[1].indices.shape == (2, 1) and best.tolist() == made[1].indices[:, 0].tolist()

    wanted = [
        Decision("m", "topk", np.array([[3, 2], [2, 0]]), scores.detach().numpy()),
        Decision("m", "argmax", np.array([[3], [2]]), scores.detach().numpy()),
        Decision("m", "argmax", np.array([[3], [2]]), scores.detach().numpy()),
    ]
    imposing = DecisionWatch(lambda: "router", lambda t: t.float().numpy(), impose=wanted)
    with imposing:
        values, indices = torch.topk(scores, 2)
        best = torch.argmax(scores, dim=-1)
        kept = scores.argmax(-1, keepdim=True)
    assert (
        indices.tolist() == [[3, 2], [2, 0]]
        and best.tolist() == [3, 2]
        and kept.tolist() == [[3], [2]]
    )
    assert np.array_equal(
        values.detach().numpy(), scores.detach().numpy()[[[0], [1]], [[3, 2], [2, 0]]]
    )
    # the imposed values are this side's own scores, gathered: gradients reach them
    values.sum().backward()
    assert scores.grad.tolist() == [[0, 0, 1, 1], [1, 0, 1, 0]]


def test_the_nnx_capture_records_top_k_with_the_module_it_ran_in():
    pytest.importorskip("jax")
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jax_impl.capture import capture_activations

    class Router(nnx.Module):
        def __init__(self, rngs):
            self.proj = nnx.Linear(3, 4, rngs=rngs)

        def __call__(self, x):
            weights, chosen = jax.lax.top_k(jax.nn.softmax(self.proj(x)), 2)
            return jnp.sum(weights, axis=-1, keepdims=True) * x + chosen.sum() * 0

    capture = capture_activations(Router(nnx.Rngs(0)), np.ones((5, 3), np.float32), loss_of=jnp.sum)
    (decision,) = capture.decisions
    assert (decision.module, decision.op, decision.indices.shape, decision.scores.shape) == (
        "(model)",
        "topk",
        (5, 2),
        (5, 4),
    )
    # restored after the capture
    assert jax.lax.top_k is not None and jax.lax.top_k.__name__ == "top_k"

"""Where the loss itself is the place two sides part (compare/judge/own_loss.py): a loss computed
from outputs that agree, whose gradient into the model agrees too (a trained CLIP's symmetric and
one-directional contrastive losses send back nearly the same gradient), is named by its value alone;
anything located elsewhere, or not compared, is not."""

from compare.judge.messages import failure_message
from compare.judge.own_loss import mark_loss_value


def _pair(**change):
    forward = {"module": None, "modules_compared": 52, "not_compared": {}, "shapes_differ": []}
    backward = {"module": None, "in_loss": False, "modules_compared": 50}
    tensors = {"outputs/loss": {"within": False}, "outputs/logits": {"within": True}}
    forward.update(change.get("forward", {}))
    backward.update(change.get("backward", {}))
    tensors.update(change.get("tensors", {}))
    return forward, backward, tensors


def test_a_loss_whose_value_alone_differs_is_named_in_the_loss():
    forward, backward, tensors = _pair()
    mark_loss_value(forward, backward, tensors)
    assert forward["in_loss"].startswith(
        "the loss computed from the model's outputs (every module agrees"
    )
    parity = {
        "worst": [
            {
                "name": "outputs/loss",
                "abs": 0.0309,
                "within": False,
                "passes_with": {"atol": 0.031, "rtol": 0.38, "fraction": 1.0},
            }
        ],
        "first_divergent_step": 0,
        "first_divergent_module": forward,
        "first_divergent_module_backward": backward,
        "tensors": tensors,
    }
    message = failure_message("torch", parity)
    assert "first divergent in the loss: the loss computed from the model's outputs" in message
    assert "would pass with" not in message  # a located difference: no tolerance is offered


def test_a_loss_is_not_named_where_a_module_an_output_or_an_uncompared_module_could_be_the_cause():
    for change in (
        {"forward": {"module": "text"}},
        {"forward": {"not_compared": {"head": "no NNX module"}}},
        {"forward": {"modules_compared": 0}},
        {"backward": {"module": "vision"}},
        {"tensors": {"outputs/logits": {"within": False}}},
        {"tensors": {"outputs/loss": {"within": True}}},
    ):
        forward, backward, tensors = _pair(**change)
        mark_loss_value(forward, backward, tensors)
        assert "in_loss" not in forward, change

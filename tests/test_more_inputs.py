"""A module called with several arrays (Hugging Face's MoE experts: hidden states, the routing's
indices and weights) has only its first input captured: of it, only "its first input agrees" may be
said. A module that returns several (its router: logits, scores, indices) has only its first output
captured: its gradient is compared only where it carries one on both sides (issue 45)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jnp = pytest.importorskip("jax.numpy")
from flax import nnx  # noqa: E402

from compare.judge.backward import first_divergent_module_backward  # noqa: E402
from compare.judge.parity import first_divergent_module  # noqa: E402
from compare.reporting.render import _backward, _module  # noqa: E402
from jax_impl.capture import capture_activations as nnx_capture  # noqa: E402
from torch_impl.capture import capture_activations as torch_capture  # noqa: E402


class TorchExperts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(4, 4)

    def forward(self, hidden, top_k_index, top_k_weights=None):
        return self.up(hidden) * top_k_weights


# as Hugging Face's: (logits, scores, indices), its caller reads the scores
class TorchRouter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(4, 2)

    def forward(self, x):
        logits = self.gate(x)
        scores, index = torch.topk(logits.softmax(-1), 1)
        return logits, scores, index


class TorchMoe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.router, self.experts = TorchRouter(), TorchExperts()

    def forward(self, x):
        _, weights, index = self.router(x)
        return self.experts(x, index, top_k_weights=weights)


class NnxExperts(nnx.Module):
    def __init__(self, *, rngs):
        self.up = nnx.Linear(4, 4, rngs=rngs)

    def __call__(self, hidden, weights):
        return self.up(hidden) * weights


class NnxMoe(nnx.Module):
    def __init__(self, *, rngs):
        self.router, self.experts = nnx.Linear(4, 2, rngs=rngs), NnxExperts(rngs=rngs)

    def __call__(self, x):
        return self.experts(x, jnp.max(nnx.softmax(self.router(x)), -1, keepdims=True))


def test_each_capture_counts_the_arrays_a_module_is_called_with_besides_its_first():
    torch_model = TorchMoe()
    captured = torch_capture(
        torch_model, torch.randn(3, 4), {n: n or "(model)" for n, _ in torch_model.named_modules()}
    )
    # the indices positionally, the weights by keyword
    assert captured.more_inputs == {"experts": 2}
    assert captured.more_outputs == {"router": 2}  # scores and indices beside the logits
    nnx_captured = nnx_capture(
        NnxMoe(rngs=nnx.Rngs(0)), np.ones((3, 4), np.float32), "channel_last"
    )
    assert nnx_captured.more_inputs == {"experts": 1}
    assert {"experts:in", "experts", "router:in", "router"} <= set(nnx_captured.arrays)


def test_a_culprit_with_inputs_not_compared_is_said_to_agree_only_in_its_first():
    x = np.ones((3, 4), np.float32)
    ref = {"router:in": x, "router": x[:, :2], "experts:in": x, "experts": x}
    other = {**ref, "experts": x * 0.5}  # the weights it was fed differ: a routing mis-port
    found = first_divergent_module(
        ref,
        other,
        {"atol": 1e-5, "rtol": 1e-4},
        ("jax", "torch"),
        more_inputs=({"experts": 1}, {"experts": 2}),
    )
    assert (found["module"], found["input_agrees"], found["inputs_not_compared"]) == (
        "experts",
        True,
        2,
    )
    assert _module(found).startswith(
        "experts (its first input agrees (2 more not compared: the difference may "
        "enter through them), its output does not"
    )
    plain = first_divergent_module(ref, other, {"atol": 1e-5, "rtol": 1e-4}, ("jax", "torch"))
    assert plain["inputs_not_compared"] == 0 and _module(plain).startswith(
        "experts (its input agrees, its output"
    )


def test_an_output_playing_another_role_on_one_side_is_left_out_of_the_backward():
    """HF's router returns its logits first and its caller reads the scores: the logits' gradient is
    zero there; the port's router returns the logits its caller reads. A passing run names no
    backward module."""
    g = np.full((3, 2), 0.25, np.float32)
    ref = {"router:in": np.ones((3, 4), np.float32), "router": g, "experts:in": g, "experts": g}
    other = {**ref, "router": np.zeros_like(g)}
    order = ["router:in", "router", "experts:in", "experts"]
    found = first_divergent_module_backward(
        ref, other, order, {"atol": 1e-6, "rtol": 1e-5}, ("jax", "torch"), ({}, {"router": 2})
    )
    assert (found["module"], found["other_roles"], found["modules_compared"]) == (
        None,
        ["router"],
        1,
    )
    assert _backward(found) == (
        "none (1 modules' gradients agree; 1 whose captured outputs play other roles on "
        "the two sides (router))"
    )
    # the same zero gradient where the module returned one array: a port's difference, named
    named = first_divergent_module_backward(
        ref, other, order, {"atol": 1e-6, "rtol": 1e-5}, ("jax", "torch")
    )
    assert named["module"] == "router" and named["other_roles"] == []

"""A module called with several arrays (Hugging Face's MoE experts: hidden states, the routing's indices and
weights) has only its first input captured: of it, only "its first input agrees" may be said (issue 45)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
jnp = pytest.importorskip("jax.numpy")
from flax import nnx  # noqa: E402

from compare.parity import first_divergent_module  # noqa: E402
from compare.render import _module  # noqa: E402
from jax_impl.capture import capture_activations as nnx_capture  # noqa: E402
from torch_impl.capture import capture_activations as torch_capture  # noqa: E402


class TorchExperts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(4, 4)

    def forward(self, hidden, top_k_index, top_k_weights=None):
        return self.up(hidden) * top_k_weights


class TorchMoe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.router, self.experts = torch.nn.Linear(4, 2), TorchExperts()

    def forward(self, x):
        weights, index = torch.topk(self.router(x).softmax(-1), 1)
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
    captured = torch_capture(torch_model, torch.randn(3, 4), {n: n or "(model)" for n, _ in
                                                                 torch_model.named_modules()})
    assert captured.more_inputs == {"experts": 2}  # the indices positionally, the weights by keyword
    nnx_captured = nnx_capture(NnxMoe(rngs=nnx.Rngs(0)), np.ones((3, 4), np.float32), "channel_last")
    assert nnx_captured.more_inputs == {"experts": 1}
    assert {"experts:in", "experts", "router:in", "router"} <= set(nnx_captured.arrays)


def test_a_culprit_with_inputs_not_compared_is_said_to_agree_only_in_its_first():
    x = np.ones((3, 4), np.float32)
    ref = {"router:in": x, "router": x[:, :2], "experts:in": x, "experts": x}
    other = {**ref, "experts": x * 0.5}  # the weights it was fed differ: a routing mis-port
    found = first_divergent_module(ref, other, {"atol": 1e-5, "rtol": 1e-4}, ("jax", "torch"),
                                   more_inputs=({"experts": 1}, {"experts": 2}))
    assert (found["module"], found["input_agrees"], found["inputs_not_compared"]) == ("experts", True, 2)
    assert _module(found).startswith("experts (its first input agrees (2 more not compared: the difference may "
                                     "enter through them), its output does not")
    plain = first_divergent_module(ref, other, {"atol": 1e-5, "rtol": 1e-4}, ("jax", "torch"))
    assert plain["inputs_not_compared"] == 0 and _module(plain).startswith("experts (its input agrees, its output")

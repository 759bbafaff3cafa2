"""Float32 islands of a float64 run (torch_impl/islands.py, jax_impl/islands.py), in this process:
the twin finders name the module whose own ops compute narrower, and nothing else; a torch model
that feeds float32 to a float64 layer is refused naming its module."""

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from common.spec import SpecError
from jax_impl.islands import float32_islands as nnx_islands
from torch_impl.islands import float32_islands as torch_islands


class TorchBlock(torch.nn.Module):
    """A Linear, then an attention-like softmax computed in float32 as Hugging Face's eager
    attention does."""

    def __init__(self, cast: bool):
        super().__init__()
        self.fc, self.attn, self.cast = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), cast

    def forward(self, x):
        scores = self.fc(x)
        weights = torch.softmax(scores, -1, dtype=torch.float32 if self.cast else None).to(x.dtype)
        return self.attn(weights)


class NnxBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.fc, self.attn = (
            nnx.Linear(8, 8, rngs=rngs),
            nnx.MultiHeadAttention(num_heads=2, in_features=8, decode=False, rngs=rngs),
        )

    def __call__(self, x):
        return self.attn(self.fc(x))


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def test_the_torch_module_that_casts_to_float32_is_named_with_its_ops_and_a_float64_one_is_clean():
    x = torch.randn(2, 8, dtype=torch.float64)
    names = {"": "(model)", "fc": "fc", "attn": "attn"}
    # the softmax runs in the block's own forward
    for cast, expected in ((True, {"(model)"}), (False, set())):
        model = TorchBlock(cast).double()
        found, widened = torch_islands(model, x, names, loss_of=lambda out: out.float().sum())
        assert widened == {}  # the run keeps its casts (train.float32_casts=keep)
        assert set(found) == expected | {"(loss)"}, found  # the loss casts to float32 too
        assert model.training  # its mode put back
    found, _ = torch_islands(TorchBlock(True).double(), x, names)
    assert found["(model)"].startswith("float32: ") and "_softmax" in found["(model)"]


def test_the_flax_attention_that_computes_its_softmax_in_float32_is_named(x64):
    model = NnxBlock(nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    model = nnx.merge(graphdef, jax.tree.map(lambda a: a.astype(np.float64), state))
    found, _ = nnx_islands(model, np.random.default_rng(0).standard_normal((1, 5, 8)))
    # flax's dot_product_attention
    assert list(found) == ["attn"] and found["attn"].startswith("float32: ")
    assert (
        nnx_islands(
            model,
            np.random.default_rng(0).standard_normal((1, 5, 8)),
            loss_of=lambda out: out.sum(),
        )[0]
        == found
    )  # a float64 loss adds none


def test_a_torch_model_feeding_float32_to_a_float64_layer_is_refused_naming_the_module():
    class Embedded(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.time_mlp = torch.nn.Linear(4, 4)

        def forward(self, t):
            # as DDPM code
            return self.time_mlp(torch.arange(4, dtype=torch.float32)[None] * t.float()[:, None])

    with pytest.raises(
        SpecError,
        match=r"^train.dtype=float64: the torch model cannot compute in float64 as "
        r"written: at module time_mlp, .*make it follow its input's dtype",
    ):
        torch_islands(
            Embedded().double(), torch.ones(2, dtype=torch.float64), {"time_mlp": "time_mlp"}
        )


def test_widened_casts_leave_no_island_on_either_side_and_are_counted(x64):
    """train.float32_casts=widen (torch_impl/widen.py, jax_impl/widen.py): the softmax Hugging
    Face's code casts to float32, the loss's .float() and flax's float32 attention compute in
    float64; every cast widened is counted; stopped, the casts are as written again."""
    from jax_impl import widen as jax_widen
    from torch_impl import widen as torch_widen

    x = torch.randn(2, 8, dtype=torch.float64)
    names = {"": "(model)", "fc": "fc", "attn": "attn"}
    model = NnxBlock(nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    model = nnx.merge(graphdef, jax.tree.map(lambda a: a.astype(np.float64), state))
    tokens = np.random.default_rng(0).standard_normal((1, 5, 8))
    torch_widen.widen_float32_casts()
    jax_widen.widen_float32_casts()
    jax.clear_caches()
    try:
        found, widened = torch_islands(
            TorchBlock(True).double(), x, names, loss_of=lambda out: out.float().sum()
        )
        assert found == {} and widened == {"softmax(dtype=float32)": 1, ".float()": 1}
        nnx_found, nnx_widened = nnx_islands(model, tokens)
        assert nnx_found == {} and sum(nnx_widened.values()) >= 1, nnx_widened
    finally:
        torch_widen.stop_widening()
        jax_widen.stop_widening()
        jax.clear_caches()
    assert set(torch_islands(TorchBlock(True).double(), x, names)[0]) == {"(model)"}
    assert list(nnx_islands(model, tokens)[0]) == ["attn"]

"""The stock layers of both frameworks correspond with no twin declaration, checked by value against each
framework's own computation: nn.MultiheadAttention <-> nnx.MultiHeadAttention (a packed in_proj split into
query/key/value, their head axes reshaped)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

from flax import nnx  # noqa: E402

from common.correspond import derive  # noqa: E402
from jax_impl.convert import to_canonical  # noqa: E402
from torch_impl.convert import manifest  # noqa: E402

E, HEADS = 16, 4


class TorchBlock(torch.nn.Module):
    def __init__(self, bias: bool):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(E, HEADS, bias=bias, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class NnxBlock(nnx.Module):
    def __init__(self, bias: bool, rngs):
        self.attn = nnx.MultiHeadAttention(num_heads=HEADS, in_features=E, use_bias=bias, decode=False, rngs=rngs)

    def __call__(self, x):
        return self.attn(x)


@pytest.mark.parametrize("bias", [True, False])
def test_multihead_attention_maps_with_no_declaration_and_computes_alike(bias):
    torch.manual_seed(0)
    model, port = TorchBlock(bias), NnxBlock(bias, nnx.Rngs(0))
    if bias:  # torch starts its biases at 0: make them count
        with torch.no_grad():
            model.attn.in_proj_bias.normal_()
            model.attn.out_proj.bias.normal_()
    shapes = {k: v.shape for k, v in to_canonical(nnx.state(port, nnx.Param)).items()}
    corr = derive(manifest(model), shapes)
    links = {link.torch: link.canonical for link in corr.links}
    assert links["attn.in_proj_weight"] == ("attn.query.kernel", "attn.key.kernel", "attn.value.kernel")
    assert links["attn.out_proj.weight"] == ("attn.out.kernel",)
    torch_arrays = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    canonical = corr.to_canonical(torch_arrays)
    assert canonical["attn.query.kernel"].shape == (E, HEADS, E // HEADS)
    for name, value in corr.to_torch(canonical).items():  # and back, bit for bit
        np.testing.assert_array_equal(value, torch_arrays[name])
    nnx.update(port, nnx.State.from_flat_path({tuple(int(p) if p.isdigit() else p for p in k.split(".")):
                                               nnx.Param(jax.numpy.asarray(v)) for k, v in canonical.items()}))
    x = np.random.default_rng(0).normal(size=(2, 5, E)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(port(jax.numpy.asarray(x))), expected, atol=2e-6)

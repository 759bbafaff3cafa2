"""The stock layers of both frameworks correspond with no twin declaration, checked by value against each
framework's own computation: nn.MultiheadAttention <-> nnx.MultiHeadAttention (a packed in_proj split into
query/key/value, their head axes reshaped); grouped and depthwise convolutions and GroupNorm."""
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


class TorchConvs(torch.nn.Module):
    """Grouped and depthwise convolutions and a GroupNorm, as torchvision's ResNeXt and MobileNet use them."""

    def __init__(self):
        super().__init__()
        self.grouped = torch.nn.Conv2d(8, 16, 3, padding=1, groups=4)
        self.norm = torch.nn.GroupNorm(4, 16)
        self.depthwise = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)

    def forward(self, x):
        return self.depthwise(torch.relu(self.norm(self.grouped(x))))


class NnxConvs(nnx.Module):
    def __init__(self, rngs):
        self.grouped = nnx.Conv(8, 16, (3, 3), padding=1, feature_group_count=4, rngs=rngs)
        self.norm = nnx.GroupNorm(16, num_groups=4, epsilon=1e-5, rngs=rngs)
        self.depthwise = nnx.Conv(16, 16, (3, 3), padding=1, feature_group_count=16, use_bias=False, rngs=rngs)

    def __call__(self, x):  # NHWC
        return self.depthwise(jax.nn.relu(self.norm(self.grouped(x))))


def test_grouped_and_depthwise_convolutions_and_group_norm_map_with_no_declaration():
    """(O, I/groups, kH, kW) <-> (kH, kW, I/groups, O) is the plain convolution layout; GroupNorm's weight is
    its scale. The port computes torch's output (NCHW against NHWC) from torch's initialisation."""
    torch.manual_seed(0)
    model, port = TorchConvs(), NnxConvs(nnx.Rngs(0))
    with torch.no_grad():  # GroupNorm starts at 1 and 0: make its affine parameters count
        model.norm.weight.normal_()
        model.norm.bias.normal_()
    shapes = {k: v.shape for k, v in to_canonical(nnx.state(port, nnx.Param)).items()}
    corr = derive(manifest(model), shapes)
    links = {link.torch: (link.canonical, link.layout) for link in corr.links}
    assert links["grouped.weight"] == (("grouped.kernel",), "conv") and shapes["grouped.kernel"] == (3, 3, 2, 16)
    assert links["depthwise.weight"] == (("depthwise.kernel",), "conv") and links["norm.weight"][0] == ("norm.scale",)
    canonical = corr.to_canonical({k: v.detach().numpy() for k, v in model.state_dict().items()})
    nnx.update(port, nnx.State.from_flat_path({tuple(k.split(".")): nnx.Param(jax.numpy.asarray(v))
                                               for k, v in canonical.items()}))
    x = np.random.default_rng(0).normal(size=(2, 8, 6, 6)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    got = np.asarray(port(jax.numpy.asarray(x.transpose(0, 2, 3, 1)))).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, expected, atol=1e-5)

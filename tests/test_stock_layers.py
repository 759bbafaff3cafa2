"""The stock layers of both frameworks correspond with no twin declaration, checked by value against
each framework's own computation: nn.MultiheadAttention <-> nnx.MultiHeadAttention (a packed in_proj
split into query/key/value, their head axes reshaped); grouped and depthwise convolutions and
GroupNorm."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

from flax import nnx  # noqa: E402

from common.twin.correspond import derive  # noqa: E402
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
        self.attn = nnx.MultiHeadAttention(
            num_heads=HEADS, in_features=E, use_bias=bias, decode=False, rngs=rngs
        )

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
    assert links["attn.in_proj_weight"] == (
        "attn.query.kernel",
        "attn.key.kernel",
        "attn.value.kernel",
    )
    assert links["attn.out_proj.weight"] == ("attn.out.kernel",)
    torch_arrays = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    canonical = corr.to_canonical(torch_arrays)
    assert canonical["attn.query.kernel"].shape == (E, HEADS, E // HEADS)
    for name, value in corr.to_torch(canonical).items():  # and back, bit for bit
        np.testing.assert_array_equal(value, torch_arrays[name])
    nnx.update(
        port,
        nnx.State.from_flat_path(
            {
                tuple(int(p) if p.isdigit() else p for p in k.split(".")): nnx.Param(
                    jax.numpy.asarray(v)
                )
                for k, v in canonical.items()
            }
        ),
    )
    x = np.random.default_rng(0).normal(size=(2, 5, E)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(port(jax.numpy.asarray(x))), expected, atol=2e-6)


class TorchConvs(torch.nn.Module):
    """Grouped and depthwise convolutions and a GroupNorm, as torchvision's ResNeXt and MobileNet
    use them."""

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
        self.depthwise = nnx.Conv(
            16, 16, (3, 3), padding=1, feature_group_count=16, use_bias=False, rngs=rngs
        )

    def __call__(self, x):  # NHWC
        return self.depthwise(jax.nn.relu(self.norm(self.grouped(x))))


def test_grouped_and_depthwise_convolutions_and_group_norm_map_with_no_declaration():
    """(O, I/groups, kH, kW) <-> (kH, kW, I/groups, O) is the plain convolution layout; GroupNorm's
    weight is its scale. The port computes torch's output (NCHW against NHWC) from torch's
    initialisation."""
    torch.manual_seed(0)
    model, port = TorchConvs(), NnxConvs(nnx.Rngs(0))
    with torch.no_grad():  # GroupNorm starts at 1 and 0: make its affine parameters count
        model.norm.weight.normal_()
        model.norm.bias.normal_()
    shapes = {k: v.shape for k, v in to_canonical(nnx.state(port, nnx.Param)).items()}
    corr = derive(manifest(model), shapes)
    links = {link.torch: (link.canonical, link.layout) for link in corr.links}
    assert links["grouped.weight"] == (("grouped.kernel",), "conv") and shapes[
        "grouped.kernel"
    ] == (3, 3, 2, 16)
    assert links["depthwise.weight"] == (("depthwise.kernel",), "conv") and links["norm.weight"][
        0
    ] == ("norm.scale",)
    canonical = corr.to_canonical({k: v.detach().numpy() for k, v in model.state_dict().items()})
    nnx.update(
        port,
        nnx.State.from_flat_path(
            {tuple(k.split(".")): nnx.Param(jax.numpy.asarray(v)) for k, v in canonical.items()}
        ),
    )
    x = np.random.default_rng(0).normal(size=(2, 8, 6, 6)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    got = np.asarray(port(jax.numpy.asarray(x.transpose(0, 2, 3, 1)))).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, expected, atol=1e-5)


class TorchUp(torch.nn.Module):
    """torch's usual 2x upsampling: as many channels out as in, so the kernel's shape cannot tell
    its layout."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(8, 8, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        return self.up(x)


class NnxUp(nnx.Module):
    # torch's padding p is Flax's k - 1 - p (+ output_padding)
    def __init__(self, rngs, transpose_kernel=False):
        self.up = nnx.ConvTranspose(
            8,
            8,
            (3, 3),
            strides=(2, 2),
            padding=((1, 2), (1, 2)),
            transpose_kernel=transpose_kernel,
            rngs=rngs,
        )

    def __call__(self, x):  # NHWC
        return self.up(x)


def _kinds(model, port):
    from jax_impl.describe import module_kinds as nnx_kinds
    from torch_impl.describe import module_kinds as torch_kinds

    return {"torch_kinds": torch_kinds(model), "nnx_kinds": nnx_kinds(port)}


def _load(port, canonical):
    nnx.update(
        port,
        nnx.State.from_flat_path(
            {tuple(k.split(".")): nnx.Param(jax.numpy.asarray(v)) for k, v in canonical.items()}
        ),
    )


@pytest.mark.parametrize("transpose_kernel, layout", [(False, "conv_transpose"), (True, "conv")])
def test_conv_transpose_takes_its_layout_from_the_nnx_module_and_computes_alike(
    transpose_kernel, layout
):
    """torch's ConvTranspose2d (in, out, kH, kW) is nnx.ConvTranspose's kernel spatially flipped
    (Flax's default) or, with transpose_kernel=True, in the convolution layout: told by the modules'
    types (the describe steps'), never by the shapes, which are alike here. The backends, which see
    one side's modules, derive the same links from the layouts decided once."""
    torch.manual_seed(0)
    model, port = TorchUp(), NnxUp(nnx.Rngs(0), transpose_kernel)
    shapes = {k: v.shape for k, v in to_canonical(nnx.state(port, nnx.Param)).items()}
    corr = derive(manifest(model), shapes, **_kinds(model, port))
    assert {link.torch: link.layout for link in corr.links} == {
        "up.weight": layout,
        "up.bias": "same",
    }
    assert corr.decided == {"up.kernel": layout}
    assert derive(manifest(model), shapes, layouts=corr.decided).links == corr.links
    torch_arrays = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    canonical = corr.to_canonical(torch_arrays)
    for name, value in corr.to_torch(canonical).items():  # and back, bit for bit
        np.testing.assert_array_equal(value, torch_arrays[name])
    _load(port, canonical)
    x = np.random.default_rng(0).normal(size=(2, 8, 5, 5)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    got = np.asarray(port(jax.numpy.asarray(x.transpose(0, 2, 3, 1)))).transpose(0, 3, 1, 2)
    assert got.shape == expected.shape == (2, 8, 10, 10)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    if layout == "conv_transpose":  # the plain convolution layout would be wrong: the flip counts
        wrong = derive(manifest(model), shapes, layouts={"up.kernel": "conv"}).to_canonical(
            torch_arrays
        )
        _load(port, wrong)
        assert (
            np.max(
                np.abs(
                    np.asarray(port(jax.numpy.asarray(x.transpose(0, 2, 3, 1)))).transpose(
                        0, 3, 1, 2
                    )
                    - expected
                )
            )
            > 0.1
        )


class NnxUpByHand(nnx.Module):
    """A port that upsamples with lax.conv_transpose in its own module: its kernel's layout is its
    own."""

    def __init__(self, rngs):
        self.up = nnx.Module()
        self.up.kernel = nnx.Param(jax.random.normal(rngs.params(), (3, 3, 8, 8)))
        self.up.bias = nnx.Param(jax.numpy.zeros(8))

    def __call__(self, x):
        y = jax.lax.conv_transpose(
            x,
            self.up.kernel[...],
            (2, 2),
            ((1, 2), (1, 2)),
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        )
        return y + self.up.bias[...]


@pytest.mark.error_case("twin-conv-transpose-undeclared", "twin-layouts-unmatched")
def test_a_users_own_conv_transpose_asks_for_its_layout_and_takes_the_declared_one():
    from common.twin.correspond import CorrespondenceError, declared_layouts

    torch.manual_seed(0)
    model, port = TorchUp(), NnxUpByHand(nnx.Rngs(0))
    shapes = {k: v.shape for k, v in to_canonical(nnx.state(port, nnx.Param)).items()}
    with pytest.raises(
        CorrespondenceError,
        match=r"torch up is a ConvTranspose2d, and its NNX counterpart up is a "
        r"Module, not an nnx.ConvTranspose: .* declare "
        r"layouts=\{'up\\\\.kernel\$': 'conv_transpose'\} in the twin",
    ):
        derive(manifest(model), shapes, **_kinds(model, port))
    declared = declared_layouts({r"up\.kernel$": "conv_transpose"}, shapes)
    corr = derive(manifest(model), shapes, layouts=declared, **_kinds(model, port))
    _load(port, corr.to_canonical({k: v.detach().numpy() for k, v in model.state_dict().items()}))
    x = np.random.default_rng(1).normal(size=(2, 8, 4, 4)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    got = np.asarray(port(jax.numpy.asarray(x.transpose(0, 2, 3, 1)))).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    with pytest.raises(
        CorrespondenceError,
        match=r"layouts \{'upp\\\\.kernel': \.\.\.\} matches no NNX parameter "
        r"\(closest up.kernel\)",
    ):
        declared_layouts({r"upp\.kernel": "conv"}, shapes)


class TorchQuery(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(E, E, bias=False)

    def forward(self, x):  # (B, T, E) -> (B, T, H, D)
        return self.q_proj(x).view(*x.shape[:2], HEADS, E // HEADS)


class NnxHeadsFirstQuery(nnx.Module):
    """Gemma's layout: a heads-first einsum kernel (H, E, D), which no rule derives from q_proj
    (H*D, E)."""

    def __init__(self, rngs):
        self.q_proj = nnx.Einsum("BTE,HED->BTHD", (HEADS, E, E // HEADS), rngs=rngs)

    def __call__(self, x):
        return self.q_proj(x)


@pytest.mark.error_case("twin-layouts-unmatched")
def test_a_declared_rearrangement_links_what_no_rule_derives_and_computes_alike():
    from common.twin.correspond import CorrespondenceError, declared_layouts

    torch.manual_seed(0)
    model, port = TorchQuery(), NnxHeadsFirstQuery(nnx.Rngs(0))
    shapes = {k: v.shape for k, v in to_canonical(nnx.state(port, nnx.Param)).items()}
    with pytest.raises(
        CorrespondenceError, match=r"q_proj.weight \[16, 16\] \(shape differs from q_proj.kernel"
    ):
        derive(manifest(model), shapes)
    corr = derive(
        manifest(model),
        shapes,
        layouts=declared_layouts({r"q_proj\.kernel$": "(h d) e -> h e d"}, shapes),
    )
    torch_arrays = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    canonical = corr.to_canonical(torch_arrays)
    np.testing.assert_array_equal(
        corr.to_torch(canonical)["q_proj.weight"], torch_arrays["q_proj.weight"]
    )
    _load(port, canonical)
    x = np.random.default_rng(0).normal(size=(2, 5, E)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(port(jax.numpy.asarray(x))), expected, atol=2e-6)
    with pytest.raises(
        CorrespondenceError,
        match=r"layout '\(h d\) e -> e h d' does not turn torch \[16, 16\] into "
        r"NNX \[4, 16, 4\]",
    ):
        derive(manifest(model), shapes, layouts={"q_proj.kernel": "(h d) e -> e h d"})


@pytest.mark.parametrize(
    "layouts, message",
    [
        (
            {r"q\.kernel": "(h d -> h d"},
            r"layout '\(h d -> h d': '\(h' is not an axis name or a parenthesised group",
        ),
        (
            {r"q\.kernel": "(h d) e -> h e"},
            r"layout '\(h d\) e -> h e': each axis must appear once on each side of '->'",
        ),
        (
            {r"q\.kernel": "flipped"},
            r"layout 'flipped' must be one of same, transpose, conv, conv_transpose",
        ),
        ({"(q": "conv"}, r"layouts '\(q' is not a valid regular expression"),
        (
            {r"q\.kernel": 3},
            r"layouts 'q\\\\.kernel' -> 3 is not a string; write layouts as \{regex over NNX",
        ),
    ],
)
@pytest.mark.error_case("twin-layouts-bad")
def test_a_layouts_declaration_that_cannot_be_read_is_refused_when_the_twin_loads(layouts, message):
    from common.twin import Twin
    from common.twin.fields import TwinError, check_fields

    twin = Twin(torch="m.py:T", nnx="m.py:N", task="classification", layouts=layouts)
    with pytest.raises(TwinError, match=message):
        check_fields(twin, "twins.py:net")

"""The step-0 capture, in one process: a correct port never names a module, a wrong one is named
where it differs. On the ResNet example as torchvision writes it (in-place ReLU after every
BatchNorm) against its NHWC NNX port, with 16 channels on 16x16 images so NCHW and NHWC activations
have the same shape."""

from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

from flax import nnx  # noqa: E402

from common.capture.activations import CHANNEL_LAST, UNKNOWN_REASON  # noqa: E402
from common.twin import resolve  # noqa: E402
from common.twin.correspond import derive  # noqa: E402
from common.twin.modules import module_map  # noqa: E402
from compare.judge.parity import first_divergent_module  # noqa: E402
from jax_impl.capture import capture_activations as nnx_capture  # noqa: E402
from jax_impl.convert import to_canonical  # noqa: E402
from torch_impl.capture import capture_activations as torch_capture  # noqa: E402
from torch_impl.convert import manifest  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "resnet"
HPARAMS = {
    "input_shape": (3, 16, 16),
    "num_classes": 10,
    "layers": (1, 1, 1),
    "widths": (16, 32, 64),
}
BOUNDS = {"atol": 1e-5, "rtol": 1e-4}  # the default forward tolerance (compare/judge/tolerances.py)
NAMES = ("jax", "torch")


def _pair(nnx_factory: str = "resnet"):
    """The torch ResNet holding the NNX port's weights (through the derived correspondence), both in
    train mode, and the torch -> NNX module names."""
    port = resolve(f"nnx_resnet.py:{nnx_factory}", str(EXAMPLE))(**HPARAMS, rngs=nnx.Rngs(0))
    model = resolve("torch_resnet.py:resnet", str(EXAMPLE))(**HPARAMS)
    canonical = {k: np.asarray(v) for k, v in to_canonical(nnx.state(port, nnx.Param)).items()}
    shapes = {k: v.shape for k, v in canonical.items()}
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in derive(manifest(model), shapes).to_torch(canonical).items():
            params[name].copy_(torch.from_numpy(value))
    return port, model, module_map([n for n, _ in model.named_modules()], shapes)


def _captures(port, model, names):
    x = np.random.default_rng(0).normal(size=(2, 3, 16, 16)).astype(np.float32)
    ours = nnx_capture(port, x.transpose(0, 2, 3, 1), CHANNEL_LAST)
    theirs = torch_capture(model, torch.from_numpy(x), names)
    return ours, theirs


def test_a_correct_resnet_names_no_module():
    ours, theirs = _captures(*_pair())
    found = first_divergent_module(
        ours.arrays, theirs.arrays, BOUNDS, NAMES, (ours.skipped, theirs.skipped)
    )
    assert found["module"] is None and found["modules_diverging"] == 0
    assert found["modules_compared"] == 28 and found["not_compared"] == {}
    # the BatchNorm output as BatchNorm returned it, not as the in-place ReLU after it left it
    assert theirs.arrays["bn1"].min() < -0.5 and theirs.arrays["bn1"].shape == (2, 16, 16, 16)
    np.testing.assert_allclose(theirs.arrays["bn1"], ours.arrays["bn1"], atol=1e-5)
    # the NNX side records the modules holding parameters
    assert set(theirs.arrays) == set(ours.arrays)


def test_a_padding_misport_is_named_at_its_convolution():
    ours, theirs = _captures(*_pair("resnet_same_padding"))
    found = first_divergent_module(
        ours.arrays, theirs.arrays, BOUNDS, NAMES, (ours.skipped, theirs.skipped)
    )
    assert found["module"] == "layer2.layers.0.conv1" and found["input_agrees"]
    assert found["output_error"]["abs"] > 0.1


def _summarized(arrays: dict) -> dict:
    """What a capture under --tensors summary|auto keeps: activations larger than a sample as
    summaries."""
    from common.files.tensor_file import SUMMARIZED_GROUPS
    from common.files.tensor_summary import summarize

    limit = SUMMARIZED_GROUPS["activations"]
    return {k: summarize(f"activations/{k}", v) if v.size > limit else v for k, v in arrays.items()}


def test_summarized_activations_name_the_same_module_and_say_they_are_summaries():
    """A capture under --tensors auto keeps summaries of the activations (statistics and a fixed
    sample): the correct port still names nothing, the padding mis-port (a difference at the borders
    only) the same convolution, and the location says it was judged on summaries."""
    from compare.reporting.render import _module

    ours, theirs = _captures(*_pair())
    found = first_divergent_module(
        _summarized(ours.arrays), _summarized(theirs.arrays), BOUNDS, NAMES
    )
    assert found["module"] is None and found["modules_compared"] == 28
    ours, theirs = _captures(*_pair("resnet_same_padding"))
    summarized = _summarized(theirs.arrays)
    assert sum(not isinstance(v, np.ndarray) for v in summarized.values()) > 10
    found = first_divergent_module(_summarized(ours.arrays), summarized, BOUNDS, NAMES)
    assert (
        found["module"] == "layer2.layers.0.conv1"
        and found["input_agrees"]
        and found["judged_by"] == "summary"
    )
    assert found["output_error"]["abs"] > 0.1
    assert _module(found).endswith("; by summaries: a difference in unsampled elements can hide)")


class PatchEmbed(torch.nn.Module):
    """A ViT's patch embedding: its output is its convolution's, flattened and transposed by its own
    code."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Conv2d(3, 16, kernel_size=4, stride=4)

    def forward(self, x):
        # (N, 16 patches, 16 features): the features moved last by the transpose
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(16, 16)

    def forward(self, hidden_states):
        return self.q(hidden_states)


class ChannelShuffle(torch.nn.Module):
    """ShuffleNet's shuffle, written out: a channel-first tensor reshaped across its channels."""

    def forward(self, x):
        n, c, h, w = x.shape
        return x.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h * w)


class TinyViT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.patch, self.norm, self.attn = PatchEmbed(), torch.nn.LayerNorm(16), Attention()
        self.shuffle = ChannelShuffle()

    def forward(self, x):
        self.shuffle(self.patch.proj(x))
        # keyword-only, as Hugging Face calls it
        return self.attn(hidden_states=self.norm(self.patch(x)))


def test_a_layout_is_read_from_the_ops_and_an_unknown_one_left_out_with_the_reason():
    """The patch embedding's output is known from its ops (a convolution, a flatten of its spatial
    axes, a transpose moving the channels last), never from the module's type; a tensor reshaped
    across its channels is left out, said why; a module called by keyword is captured."""
    model = TinyViT()
    names = {n: n or "(model)" for n, _ in model.named_modules()}
    captured = torch_capture(model, torch.randn(2, 3, 16, 16), names)
    assert captured.skipped == {"shuffle": UNKNOWN_REASON}
    assert captured.arrays["patch.proj"].shape == (2, 4, 4, 16)
    np.testing.assert_array_equal(
        captured.arrays["patch"], captured.arrays["patch.proj"].reshape(2, 16, 16)
    )
    # a LayerNorm's input has its features last: the patches as the
    # convolution made them, channel-last
    np.testing.assert_array_equal(
        captured.arrays["norm:in"], captured.arrays["patch.proj"].reshape(2, 16, 16)
    )
    # passed by keyword
    np.testing.assert_array_equal(captured.arrays["attn:in"], captured.arrays["norm"])
    assert captured.arrays["attn"].shape == (2, 16, 16)


def test_shapes_that_still_differ_diverge_said_as_such_never_transposed():
    """Both sides store channel-last by the layout each module fixes: a module fed the same input
    whose output has another size (a port that pads otherwise) is where the ports part, though no
    element can be compared."""
    x = np.ones((2, 8, 8, 3), np.float32)
    ref = {
        "conv:in": x,
        "conv": np.zeros((2, 8, 8, 4), np.float32),
        "head": np.zeros((2, 5), np.float32),
    }
    other = {
        "conv:in": x,
        "conv": np.zeros((2, 7, 7, 4), np.float32),
        "head": np.ones((2, 5), np.float32),
    }
    found = first_divergent_module(ref, other, BOUNDS, NAMES)
    assert found["module"] == "conv" and found["input_agrees"] and found["not_compared"] == {}
    assert found["modules_compared"] == found["modules_diverging"] == 2
    assert found["output_error"] == {
        "abs": None,
        "rel": None,
        "tolerance_used": None,
        "within": False,
        "note": "output shapes differ: jax [2, 8, 8, 4], torch [2, 7, 7, 4] (both channel-last)",
    }


class SqueezeExcitation(torch.nn.Module):
    """torchvision's (torchvision.ops.SqueezeExcitation, as MobileNetV3 and EfficientNet use it):
    its last submodule makes the (N, C, 1, 1) scale, its own code multiplies its input by it."""

    def __init__(self, channels: int, squeezed: int):
        super().__init__()
        self.avgpool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2 = (
            torch.nn.Conv2d(channels, squeezed, 1),
            torch.nn.Conv2d(squeezed, channels, 1),
        )
        self.activation, self.scale_activation = torch.nn.ReLU(), torch.nn.Hardsigmoid()

    def forward(self, x):
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class Gated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.se = torch.nn.Conv2d(3, 8, 3, padding=1), SqueezeExcitation(8, 4)

    def forward(self, x):
        return self.se(self.conv(x)).mean((2, 3))


class NnxSqueezeExcitation(nnx.Module):
    def __init__(self, channels: int, squeezed: int, rngs: nnx.Rngs):
        self.fc1 = nnx.Conv(channels, squeezed, (1, 1), rngs=rngs)
        self.fc2 = nnx.Conv(squeezed, channels, (1, 1), rngs=rngs)

    def __call__(self, x):
        scale = self.fc2(nnx.relu(self.fc1(x.mean(axis=(1, 2), keepdims=True))))
        return jax.nn.hard_sigmoid(scale) * x


class NnxGated(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.conv, self.se = (
            nnx.Conv(3, 8, (3, 3), padding=1, rngs=rngs),
            NnxSqueezeExcitation(8, 4, rngs),
        )

    def __call__(self, x):
        return self.se(self.conv(x)).mean(axis=(1, 2))


def test_a_gate_that_scales_its_input_keeps_its_inputs_layout_and_is_compared():
    """A squeeze-and-excitation block's output has the shape of its input, not of its last
    submodule's: it was left out as reshaped by its own code. It takes its input's layout, and the
    correct port agrees at it."""
    model, port = Gated(), NnxGated(nnx.Rngs(0))
    with torch.no_grad():
        for name in ("conv", "se.fc1", "se.fc2"):
            conv, ported = model.get_submodule(name), eval(f"port.{name}")
            conv.weight.copy_(
                torch.from_numpy(np.asarray(ported.kernel[...]).transpose(3, 2, 0, 1))
            )
            conv.bias.copy_(torch.from_numpy(np.asarray(ported.bias[...])))
    names = {
        n: n or "(model)"
        for n, _ in model.named_modules()
        if n in ("", "conv", "se", "se.fc1", "se.fc2")
    }
    x = np.random.default_rng(0).normal(size=(2, 3, 6, 5)).astype(np.float32)
    theirs = torch_capture(model, torch.from_numpy(x), names)
    ours = nnx_capture(port, x.transpose(0, 2, 3, 1), CHANNEL_LAST)
    assert theirs.skipped == {} and theirs.arrays["se"].shape == ours.arrays["se"].shape == (
        2,
        6,
        5,
        8,
    )
    found = first_divergent_module(
        ours.arrays, theirs.arrays, BOUNDS, NAMES, (ours.skipped, theirs.skipped)
    )
    assert (
        found["module"] is None and found["not_compared"] == {} and found["modules_compared"] == 5
    )

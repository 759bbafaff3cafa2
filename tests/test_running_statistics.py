"""A full torchvision-style state_dict (parameters, BatchNorm running statistics, an int64 batch
count) as a start, piece by piece in one process: read on the torch side, carried under canonical
names, loaded into each framework's own BatchNorm state."""

from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

from flax import nnx  # noqa: E402

from common.twin import resolve  # noqa: E402
from common.twin.modules import module_map  # noqa: E402
from common.weights import CheckpointError  # noqa: E402
from common.weights.carried import StartState  # noqa: E402
from compare.runs.prepare import running_statistics  # noqa: E402
from jax_impl import convert as jax_convert  # noqa: E402
from jax_impl.convert import to_canonical  # noqa: E402
from torch_impl import convert as torch_convert  # noqa: E402
from torch_impl.checkpoint_io import load_torch_side  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "resnet"
HPARAMS = {
    "input_shape": (3, 16, 16),
    "num_classes": 10,
    "layers": (1, 1, 1),
    "widths": (16, 32, 64),
}


def _trained_torch_resnet():
    """The torch ResNet after three train-mode forwards: running statistics far from their 0 / 1
    init."""
    torch.manual_seed(0)
    model = resolve("torch_resnet.py:resnet", str(EXAMPLE))(**HPARAMS)
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(8, 3, 16, 16) * 2 + 1)
    return model


def test_a_full_state_dict_is_read_with_its_buffers_and_its_statistics_get_nnx_names(tmp_path):
    model = _trained_torch_resnet()
    path = tmp_path / "resnet.pt"
    torch.save(model.state_dict(), path)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    buffers = {n: tuple(b.shape) for n, b in model.named_buffers()}
    params, found = load_torch_side(f"torch:{path}", None, shapes, buffers)
    assert set(params) == set(shapes) and set(found) == set(buffers)
    assert (
        found["bn1.num_batches_tracked"].dtype == np.int64
        and int(found["bn1.num_batches_tracked"]) == 3
    )

    port = resolve("nnx_resnet.py:resnet", str(EXAMPLE))(**HPARAMS, rngs=nnx.Rngs(0))
    canonical = {k: v.shape for k, v in to_canonical(nnx.state(port, nnx.Param)).items()}
    state, others = running_statistics(found, canonical, {}, "torch checkpoint")
    assert len(state) == 18 and len(others) == 9 and others[0] == "bn1.num_batches_tracked"
    np.testing.assert_array_equal(
        state["layer2.layers.0.downsample.layers.1.var"],
        model.layer2[0].downsample[1].running_var.numpy(),
    )

    # each framework's BatchNorm takes them by name
    rest = jax_convert.load_state(nnx.split(port, nnx.Param, ...)[2], StartState(state))
    loaded = to_canonical(nnx.filter_state(rest, nnx.BatchStat))
    np.testing.assert_array_equal(np.asarray(loaded["bn1.mean"]), model.bn1.running_mean.numpy())
    fresh = resolve("torch_resnet.py:resnet", str(EXAMPLE))(**HPARAMS)
    names = module_map([n for n, _ in fresh.named_modules()], canonical)
    torch_convert.load_state(fresh, StartState(state), names)
    np.testing.assert_array_equal(
        fresh.layer3[0].bn2.running_var.numpy(), model.layer3[0].bn2.running_var.numpy()
    )
    with pytest.raises(CheckpointError, match="running statistics stem.mean match no BatchNorm"):
        torch_convert.load_state(fresh, StartState({"stem.mean": np.zeros(16, np.float32)}), names)


def test_an_integer_parameter_or_a_tensor_the_model_lacks_is_refused(tmp_path):
    model = _trained_torch_resnet()
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    buffers = {n: tuple(b.shape) for n, b in model.named_buffers()}
    state = model.state_dict()
    torch.save({**state, "fc.bias": state["fc.bias"].long()}, tmp_path / "ints.pt")
    with pytest.raises(
        CheckpointError, match="tensor fc.bias has dtype int64; parameters must be float32"
    ):
        load_torch_side(f"torch:{tmp_path / 'ints.pt'}", None, shapes, buffers)
    torch.save({**state, "head.extra": torch.zeros(3)}, tmp_path / "extra.pt")
    with pytest.raises(
        CheckpointError, match=r"1 tensor\(s\) the model does not have: head.extra \[3\]"
    ):
        load_torch_side(f"torch:{tmp_path / 'extra.pt'}", None, shapes, buffers)

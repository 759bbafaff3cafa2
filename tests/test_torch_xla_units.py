"""In-process checks of the torch twin: layouts, round trip, and that the loop is the classic one."""
import os

import numpy as np
import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")
torch = pytest.importorskip("torch")

from common.spec import load_spec  # noqa: E402
from common.weights import init_params  # noqa: E402


@pytest.mark.parametrize("preset, overrides", [("mlp-tiny", []), ("cnn-digits", []), ("gpt-tiny", []),
                                               ("gpt-tiny", ["model.tied_embeddings=false"]),
                                               ("cnn-digits", ["model.pooling=flatten"])])
def test_canonical_round_trip_is_bit_identical(preset, overrides):
    from torch_xla_impl.convert import from_state_dict, load_canonical
    from torch_xla_impl.models import build_model

    model_spec = load_spec(preset, overrides).model
    canonical = init_params(model_spec, seed=7)
    model = build_model(model_spec)
    load_canonical(model, canonical, model_spec)
    back = from_state_dict(model.state_dict(), model_spec)
    assert set(back) == set(canonical)
    for name, value in canonical.items():
        assert back[name].dtype == value.dtype and np.array_equal(back[name], value), name


def test_layouts_are_converted():
    from torch_xla_impl.convert import load_canonical
    from torch_xla_impl.models import build_model

    spec = load_spec("gpt-tiny").model
    canonical = init_params(spec, 0)
    model = build_model(spec)
    load_canonical(model, canonical, spec)
    state = model.state_dict()
    qkv = state["blocks.0.attn.qkv.weight"].numpy()  # (3D, D), rows q | k | v
    assert qkv.shape == (192, 64)
    assert np.array_equal(qkv[64:128], canonical["blocks.0.attn.k.kernel"].T)
    assert np.array_equal(state["blocks.0.mlp.fc.weight"].numpy(), canonical["blocks.0.mlp.fc.kernel"].T)
    cnn = load_spec("cnn-digits").model
    c = init_params(cnn, 0)
    m = build_model(cnn)
    load_canonical(m, c, cnn)
    assert np.array_equal(m.state_dict()["convs.1.weight"].numpy(), c["convs.1.kernel"].transpose(3, 2, 0, 1))


def test_shape_mismatch_names_the_tensor():
    from torch_xla_impl.convert import load_canonical
    from torch_xla_impl.models import build_model

    spec = load_spec("mlp-tiny").model
    canonical = init_params(spec, 0)
    canonical["head.kernel"] = np.zeros((256, 9), np.float32)
    with pytest.raises(ValueError, match="tensor head.kernel has shape"):
        load_canonical(build_model(spec), canonical, spec)


def test_the_loop_consumes_mp_device_loader_and_calls_optimizer_step(tmp_path, monkeypatch):
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as pl

    from torch_xla_impl import train
    from torch_xla_impl.instrument import CompileMonitor

    calls = {"optimizer_step": 0, "loader_batches": 0}
    real_step = xm.optimizer_step

    def counting_step(optimizer, *args, **kwargs):
        calls["optimizer_step"] += 1
        return real_step(optimizer, *args, **kwargs)

    class CountingLoader(pl.MpDeviceLoader):
        def __iter__(self):
            for batch in super().__iter__():
                calls["loader_batches"] += 1
                assert batch["inputs"].device.type == "xla"  # moved by the loader, not by us
                yield batch

    monkeypatch.setattr(train.xm, "optimizer_step", counting_step)
    monkeypatch.setattr(train.pl, "MpDeviceLoader", CountingLoader)
    spec = load_spec("mlp-tiny", ["train.steps=4"])
    record, _ = train.run(spec, tmp_path, parity=False, monitor=CompileMonitor(), throughput_steps=3, mode="single")
    assert calls == {"optimizer_step": 7, "loader_batches": 7}
    assert len(record.steps) == 4 and record.losses[0] == pytest.approx(2.3774, abs=1e-3)

"""In-process checks of the torch twin: layouts, round trip, and that the loop is the classic one."""
import os

import numpy as np
import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")
torch = pytest.importorskip("torch")

from common import harness  # noqa: E402
from common.harness import RunOptions  # noqa: E402
from common.presets import load_spec  # noqa: E402


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
    options = RunOptions(throughput_steps=3, out_dir=tmp_path)
    record, _ = harness.run(lambda: train.make_trainer(spec, options, CompileMonitor(), mode="single"), options)
    assert calls == {"optimizer_step": 7, "loader_batches": 7}
    assert len(record.steps) == 4 and record.losses[0] == pytest.approx(2.3774, abs=1e-3)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's own raise
def test_an_error_raised_in_the_loader_thread_reaches_the_loop_as_itself(tmp_path, monkeypatch):
    """MpDeviceLoader builds batches in its own thread; what that thread raises used to end the loop as
    `StopIteration` (a crash, exit 3). It is raised in the loop as itself: a DataError stays a usage error."""
    from common.data import DataError, make_dataset
    from torch_xla_impl import train
    from torch_xla_impl.instrument import CompileMonitor

    class FailsAtStep2:
        def __init__(self, spec):
            self.data = make_dataset(spec)

        def global_batch(self, step):
            if step == 2:
                raise DataError("tokens.bin: token id 999 at position 4 is outside model.vocab_size=256")
            return self.data.global_batch(step)

    monkeypatch.setattr(train, "make_dataset", FailsAtStep2)
    spec = load_spec("mlp-tiny", ["train.steps=4"])
    with pytest.raises(DataError, match=r"^tokens.bin: token id 999 at position 4 is outside model.vocab_size=256$"):
        options = RunOptions(throughput_steps=0, out_dir=tmp_path)
        harness.run(lambda: train.make_trainer(spec, options, CompileMonitor(), mode="single"), options)


def test_a_capture_run_trains_nothing_and_computes_every_copy_as_eager_torch(tmp_path):
    """compare's on-demand capture (--activations-only) on torch_xla: step 0's activations from the start
    weights in one graph, no step and no compile event; every captured module equal to eager torch's."""
    from torch_impl import train as eager
    from torch_xla_impl import train
    from torch_xla_impl.instrument import CompileMonitor

    spec = load_spec("gpt-tiny", ["train.steps=1"])
    options = RunOptions(activations=True, train=False, hlo=False, out_dir=tmp_path / "xla")
    record, tensors = harness.run(lambda: train.make_trainer(spec, options, CompileMonitor(), mode="single"), options)
    assert record.steps == [] and record.compile_events == []
    options = RunOptions(activations=True, train=False, hlo=False, out_dir=tmp_path / "torch")
    _, reference = harness.run(lambda: eager.make_trainer(spec, options), options)
    captured, expected = tensors["activations"], reference["activations"]
    assert sorted(captured) == sorted(expected) and "blocks.0.ln1" in captured and len(captured) > 20
    for name, array in expected.items():
        assert np.abs(captured[name] - array).max() < 1e-5, name

"""In-process checks of the torch twin: layouts, round trip, and that the loop is the classic
one."""

import os

import numpy as np
import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")
torch = pytest.importorskip("torch")
# torch_xla's runtime in the test's own process: slow, so that `make test-fast`'s processes import
# no torch_xla (tests/conftest.py starts it first where these tests may run)
pytestmark = pytest.mark.slow

from common.presets import load_spec  # noqa: E402
from driver import harness  # noqa: E402
from driver.harness import RunOptions  # noqa: E402


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
    record, _ = harness.run(
        lambda: train.make_trainer(spec, options, CompileMonitor(), mode="single"), options
    )
    assert calls == {"optimizer_step": 7, "loader_batches": 7}
    assert len(record.steps) == 4 and record.losses[0] == pytest.approx(2.3774, abs=1e-3)


# the thread's own raise
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_error_raised_in_the_loader_thread_reaches_the_loop_as_itself(tmp_path, monkeypatch):
    """MpDeviceLoader builds batches in its own thread; what that thread raises used to end the loop
    as `StopIteration` (a crash, exit 3). It is raised in the loop as itself: a DataError stays a
    usage error."""
    from common.data import DataError, make_dataset
    from torch_xla_impl import train
    from torch_xla_impl.instrument import CompileMonitor

    class FailsAtStep2:
        def __init__(self, spec):
            self.data = make_dataset(spec)

        def global_batch(self, step):
            if step == 2:
                raise DataError(
                    "tokens.bin: token id 999 at position 4 is outside model.vocab_size=256"
                )
            return self.data.global_batch(step)

    monkeypatch.setattr(train, "make_dataset", FailsAtStep2)
    spec = load_spec("mlp-tiny", ["train.steps=4"])
    with pytest.raises(
        DataError, match=r"^tokens.bin: token id 999 at position 4 is outside model.vocab_size=256$"
    ):
        options = RunOptions(throughput_steps=0, out_dir=tmp_path)
        harness.run(
            lambda: train.make_trainer(spec, options, CompileMonitor(), mode="single"), options
        )


def test_a_capture_run_trains_nothing_and_computes_every_copy_as_eager_torch(tmp_path):
    """compare's on-demand capture (--activations-only) on torch_xla: step 0's activations from the
    start weights in one graph, no step and no compile event; every captured module equal to eager
    torch's."""
    from torch_impl import train as eager
    from torch_xla_impl import train
    from torch_xla_impl.instrument import CompileMonitor

    spec = load_spec("gpt-tiny", ["train.steps=1"])
    options = RunOptions(activations=True, train=False, hlo=False, out_dir=tmp_path / "xla")
    record, tensors = harness.run(
        lambda: train.make_trainer(spec, options, CompileMonitor(), mode="single"), options
    )
    assert record.steps == [] and record.compile_events == []
    options = RunOptions(activations=True, train=False, hlo=False, out_dir=tmp_path / "torch")
    _, reference = harness.run(lambda: eager.make_trainer(spec, options), options)
    captured, expected = tensors["activations"], reference["activations"]
    assert (
        sorted(captured) == sorted(expected) and "blocks.0.ln1" in captured and len(captured) > 20
    )
    for name, array in expected.items():
        assert np.abs(captured[name] - array).max() < 1e-5, name


def test_xlas_dump_goes_to_a_memory_folder_of_its_own_which_every_ending_removes(
    tmp_path, monkeypatch
):
    """XLA's dump (thousands of small files per compile) is written in memory: removed at the end of
    the run, a crash included, and by the next run when a killed process left it; never a dump
    folder the user named."""
    import subprocess
    import sys

    from torch_xla_impl import instrument

    memory = tmp_path / "shm"
    memory.mkdir()
    monkeypatch.setattr(instrument, "MEMORY_ROOT", memory)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    # a killed run's: its process is gone
    stale = memory / f"{instrument.MEMORY_PREFIX}{dead.stdout.strip()}"
    alive = memory / f"{instrument.MEMORY_PREFIX}{os.getppid()}"  # a running one's
    for folder in (stale, alive):
        folder.mkdir()
        (folder / "module_0000.txt").write_text("HloModule x")
    user_dump = tmp_path / "my-dump"
    user_dump.mkdir()
    (user_dump / "module_0000.txt").write_text("the user's own dump")
    monkeypatch.setenv("XLA_FLAGS", f"--xla_dump_to={user_dump}")
    # configure_debug sets them: put back after
    for name in (instrument.DUMP_ENV, "PT_XLA_DEBUG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    run_dir = tmp_path / "run"

    instrument.configure_debug(run_dir, hlo=True)
    ours = instrument.dump_dir(run_dir)
    assert ours == memory / f"{instrument.MEMORY_PREFIX}{os.getpid()}"
    assert (
        os.environ["XLA_FLAGS"]
        == f"--xla_dump_to={user_dump} --xla_dump_to={ours} --xla_dump_hlo_as_text"
    )
    assert not stale.exists() and alive.exists()
    ours.mkdir()
    with pytest.raises(RuntimeError), instrument.removed_at_end(ours):
        raise RuntimeError("a crash mid-run")
    assert (
        not ours.exists() and (user_dump / "module_0000.txt").read_text() == "the user's own dump"
    )

    monkeypatch.setattr(instrument, "MEMORY_MIN_FREE", 1 << 62)  # no room in memory: beside the run
    instrument.configure_debug(run_dir, hlo=True)
    assert instrument.dump_dir(run_dir) == run_dir.resolve() / instrument.DUMP_DIR
    # no dump: what the run removes is never the user's folder
    instrument.configure_debug(run_dir, hlo=False)
    assert instrument.dump_dir(run_dir) == run_dir / instrument.DUMP_DIR

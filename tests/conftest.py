"""Process-wide setup of the test session.

PyTorch's autograd engine sizes its per-device queues at the first backward of a process, and torch_xla
counts XLA devices once its runtime has started. Tests in this process run backwards on the CPU (the
Hugging Face reference, the twins) and on XLA (tests/test_torch_xla_units.py): when a CPU backward came
first, the XLA one failed an internal assert of the engine (measured). Starting torch_xla's CPU runtime
before any test, where torch_xla is installed, makes the order not matter.
"""
import importlib.util
import os

import pytest

if importlib.util.find_spec("torch_xla") is not None:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch_xla

    torch_xla.device()


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """One finished compare run (jax alone, mlp-tiny, 3 steps) that tests read or reuse with --jax-record; a
    test that changes it works on a copy."""
    from tests.helpers import run_cli

    out = tmp_path_factory.mktemp("finished") / "run"
    proc = run_cli("compare", "--quiet", "--out", str(out), "--backend", "jax", "--spec", "mlp-tiny", "--steps", "3")
    assert proc.returncode == 0, proc.stderr
    return out

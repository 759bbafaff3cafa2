"""Process-wide setup of the test session.

PyTorch's autograd engine sizes its per-device queues at the first backward of a process, and torch_xla
counts XLA devices once its runtime has started. Tests in this process run backwards on the CPU (the
Hugging Face reference, the twins) and on XLA (tests/test_torch_xla_units.py): when a CPU backward came
first, the XLA one failed an internal assert of the engine (measured). Starting torch_xla's CPU runtime
before any test, where torch_xla is installed, makes the order not matter.
"""
import importlib.util
import os

if importlib.util.find_spec("torch_xla") is not None:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch_xla

    torch_xla.device()

"""The GPU and TPU environments `make demo PLATFORM=gpu|tpu` builds resolve from their pins on this
CPU machine: the resolver installs nothing (tests/platforms.py), so no accelerator is needed to know
that each one's packages install together."""

import pytest

from tests.platforms import REPO, read_constraints, resolve

ENVIRONMENTS = {  # extra: (its pins, what it must hold, what it must not)
    # JAX's CUDA 12 plugin beside torch's own CUDA 12.8 libraries, one cuDNN for both
    "gpu": (
        "constraints-gpu.txt",
        {
            "jax": "0.10.2",
            "jax-cuda12-plugin": "0.10.2",
            "torch": "2.9.0",
            "torchax": "0.0.13",
            "nvidia-cudnn-cu12": "9.10.2.21",
        },
        ("torch-xla", "libtpu"),
    ),
    "tpu-jax": (
        "constraints-tpu-jax.txt",
        {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"},
        ("torch", "torch-xla"),
    ),
    "tpu-torch-xla": (
        "constraints-tpu-torch-xla.txt",
        {"torch": "2.9.0", "torch-xla": "2.9.0", "libtpu": "0.0.21"},
        ("jax", "jaxlib"),
    ),
}


@pytest.mark.slow  # reads the package index (uv, ~0.5 s each); it starts no backend
@pytest.mark.parametrize("extra", ENVIRONMENTS)
def test_each_platform_environment_resolves_exactly_to_its_pins(extra):
    constraints, holds, lacks = ENVIRONMENTS[extra]
    pins = read_constraints(REPO / constraints)
    resolved = resolve(extra, REPO / constraints)
    # every pin used, nothing unpinned: what the VM installs is what was resolved here
    assert resolved == pins
    assert {name: resolved[name] for name in holds} == holds
    # e.g. the two libtpu releases never meet in one environment
    assert not set(lacks) & set(resolved)
    shared = read_constraints(REPO / "constraints.txt")  # the CPU environment CI tests
    assert {n: v for n, v in pins.items() if n in shared and shared[n] != v} == {}

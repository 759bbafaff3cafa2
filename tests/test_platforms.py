"""The TPU environments `make demo PLATFORM=tpu` builds resolve from their pins on this CPU machine: pip installs
nothing (--dry-run), so no TPU is needed to know that each one's packages install together."""
import pytest

from tests.platforms import REPO, read_constraints, resolve

TPU_ENVIRONMENTS = {  # extra: (its pins, what it must hold, what it must not)
    "tpu-jax": ("constraints-tpu-jax.txt", {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"},
                ("torch", "torch-xla")),
    "tpu-torch-xla": ("constraints-tpu-torch-xla.txt", {"torch": "2.9.0", "torch-xla": "2.9.0", "libtpu": "0.0.21"},
                      ("jax", "jaxlib")),
}


@pytest.mark.slow  # pip reads the package index (~8 s each); it starts no backend
@pytest.mark.parametrize("extra", TPU_ENVIRONMENTS)
def test_each_tpu_environment_resolves_exactly_to_its_pins(extra):
    constraints, holds, lacks = TPU_ENVIRONMENTS[extra]
    pins = read_constraints(REPO / constraints)
    resolved = resolve(extra, REPO / constraints)
    assert resolved == pins  # every pin used, nothing unpinned: what the VM installs is what was resolved here
    assert {name: resolved[name] for name in holds} == holds
    assert not set(lacks) & set(resolved)  # the two libtpu releases never meet in one environment
    shared = read_constraints(REPO / "constraints.txt")  # the CPU environment CI tests
    assert {n: v for n, v in pins.items() if n in shared and shared[n] != v} == {}

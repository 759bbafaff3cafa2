"""The newer runtimes of the same torch model: eager PyTorch (`torch`) and torchax, each run
alone."""

import json

import numpy as np
import pytest

from analysis.hlo import matmul_flops
from common.files.tensor_file import read_tensors
from tests.helpers import max_loss_diff, run_cli, train

pytestmark = pytest.mark.slow


def test_eager_torch_says_it_compiles_nothing_and_counts_its_flops(tmp_path):
    rec = train("torch_impl", tmp_path / "torch", "--spec", "mlp-tiny", "--steps", "6", "--parity")
    jax = train("jax_impl", tmp_path / "jax", "--spec", "mlp-tiny", "--steps", "6", "--parity")
    assert rec.backend == "torch" and rec.status == "ok" and len(rec.steps) == 6
    assert rec.compile_events == [] and rec.settle_steps == 0
    assert rec.extra.notes["compiles"].startswith("none: eager PyTorch")
    # torch's FlopCounterMode and the JAX twin's HLO agree on a step's matmul flops: forward, and
    # backward twice over except the first layer's input gradient, which nobody needs
    expected = 2 * 128 * (2 * 784 * 256 + 3 * 256 * 256 + 3 * 256 * 10)
    assert (
        rec.flops_per_step
        == matmul_flops((tmp_path / "jax" / "train_step.hlo.txt").read_text())
        == expected
    )
    # counted on the parity step (the same forward and backward of step 0's batch); a run without
    # parity tensors counts one of its own after the loop: the same number
    alone = train("torch_impl", tmp_path / "alone", "--spec", "mlp-tiny", "--steps", "2")
    assert alone.flops_per_step == expected and alone.flops_source == rec.flops_source
    assert max_loss_diff(rec, jax) < 1e-5
    tensors, jax_tensors = (
        read_tensors(tmp_path / "torch", rec),
        read_tensors(tmp_path / "jax", jax),
    )
    # the final parameters, not the ones after throughput
    for name, value in jax_tensors["params"].items():
        assert np.max(np.abs(tensors["params"][name] - value)) < 1e-4, name


@pytest.mark.error_case("torch-mesh")
def test_eager_torch_refuses_a_mesh_in_one_line(tmp_path):
    proc = run_cli("torch_impl", "--spec", "mlp-tiny", "--mesh", "data=2", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("error: the torch backend runs eagerly on one device")
    )


def test_torchax_on_a_mesh_matches_its_single_device_run(tmp_path):
    args = ("--spec", "gpt-tiny", "--steps", "6")
    single = train("torchax_impl", tmp_path / "single", *args)
    meshed = train("torchax_impl", tmp_path / "mesh", *args, "--mesh", "data=2,tensor=2")
    assert meshed.platform["device_count"] == 4 and meshed.extra.notes["mesh_strategy"] == "dpxtp"
    assert max_loss_diff(single, meshed) <= 1e-5
    for rec in (single, meshed):
        loop = [e for e in rec.compile_events if e.phase == "loop"]
        # compiles at step 0, never again: 0 steady-state recompiles
        assert [e.step for e in loop] == [0]
    text = (tmp_path / "mesh" / meshed.hlo_stats["hlo_file"]).read_text()
    assert "all-reduce" in text  # the tensor-parallel layout really runs with collectives


def test_the_new_runtimes_are_deterministic_and_compare_with_each_other(tmp_path):
    proc = run_cli(
        "compare",
        "--out",
        str(tmp_path),
        "--backend",
        "torch,torchax",
        "--spec",
        "mlp-tiny",
        "--steps",
        "4",
        "--check-determinism",
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    # jax absent: first listed
    assert report["reference"] == "torch" and list(report["parity"]) == ["torchax"]
    assert {n: d["bitwise_equal"] for n, d in report["determinism"].items()} == {
        "torch": True,
        "torchax": True,
    }

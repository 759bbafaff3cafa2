"""The JAX twin through `python -m jax_impl` (and its pieces in-process where that is cheaper)."""

import numpy as np
import pytest

from common.files.record import read_record
from common.weights import init_params
from tests.helpers import max_loss_diff, run_cli, train

pytestmark = pytest.mark.slow

# Every strategy on two families at least, and each family's tensor-parallel rule (the JAX twin is
# the reference: more than torch_xla's test_spmd_runs_match_the_single_device_run)
MESHES = {
    "mlp-tiny": ("data=8", "data=4,tensor=2"),
    "cnn-digits": ("fsdp=8", "data=4,tensor=2"),
    "gpt-tiny": ("data=8", "fsdp=8", "data=4,tensor=2"),
}


@pytest.mark.parametrize("preset", MESHES)
def test_sharded_runs_match_the_single_device_run(preset, jax_single, tmp_path):
    single = read_record(jax_single(preset))
    assert single.platform["device_count"] == 1
    for mesh in MESHES[preset]:
        sharded = train(
            "jax_impl",
            tmp_path / mesh.replace(",", "_"),
            "--spec",
            preset,
            "--steps",
            "5",
            "--mesh",
            mesh,
        )
        assert sharded.platform["device_count"] == 8
        assert max_loss_diff(single, sharded) < 1e-5, (mesh, single.losses, sharded.losses)
        # tensor parallel: the compiled step all-reduces; one device never does
        if "tensor" in mesh:
            ops = sharded.hlo_stats["reported_ops"]
            assert ops["all-reduce"] > 0 and ops["dot"] > 0 and sharded.hlo_stats["flops"] > 0
            assert single.hlo_stats["reported_ops"]["all-reduce"] == 0


def test_fixed_shapes_compile_the_loop_once(jax_single):
    rec = read_record(jax_single("mlp-tiny"))
    loop = [e for e in rec.compile_events if e.phase == "loop"]
    assert len(loop) == 1 and loop[0].step == 0 and loop[0].fun_name == "jit(_train_step)"
    assert any(e.phase == "setup" for e in rec.compile_events)
    assert rec.recompile_causes == []
    assert len(rec.steps) == 5 and all(s.wall_ms > 0 for s in rec.steps)


@pytest.mark.parametrize("mesh", ["data=4", "data=2,tensor=2"])
def test_two_processes_match_one_process(mesh, jax_single, tmp_path):
    """compare --processes 2: jax and torchax each run as two cooperating processes
    (jax.distributed, the coordinator on 127.0.0.1; compare/runs/processes.py), two of the mesh's
    four devices each, and eager torch as two data-parallel processes (torch.distributed, gloo): the
    same losses as one process on one device, parity between them, and only process 0 writes. Under
    --tensors auto jax summarizes its sharded tensors on the devices (jax_impl/summary.py), never
    gathering one to a process."""
    import json

    from common.files.tensor_file import read_tensors

    out = tmp_path / "multi"
    # auto: jax's summaries reduced over both processes' shards
    tensors = "auto" if "tensor" in mesh else "full"
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(out),
        "--backend",
        "jax,torch,torchax",
        "--spec",
        "gpt-tiny",
        "--steps",
        "5",
        "--mesh",
        mesh,
        "--processes",
        "2",
        "--tensors",
        tensors,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "pass", report["verdict"]
    rows = report["parity"]["torch"]["tensors"]
    assert any(row.get("judged_by") == "summary" for row in rows.values()) == (tensors == "auto")
    assert all(report["parity"][name]["loss"]["max_abs"] < 1e-5 for name in ("torch", "torchax"))
    single = read_record(jax_single("gpt-tiny"))
    for name, devices in (("jax", 4), ("torch", 2), ("torchax", 4)):
        multi = read_record(out / name)
        assert multi.platform["process_count"] == 2 and multi.platform["device_count"] == devices, (
            name
        )
        assert max_loss_diff(single, multi) < 1e-5, (name, single.losses, multi.losses)
        assert [p.name for p in (out / name / "processes").iterdir()] == ["process-1.log"]
        # its whole tensors as each process's shards (common/files/shards.py)
        if name != "torch" and tensors == "full":
            assert sorted(p.name for p in (out / name / "shards").iterdir()) == [
                "process-0.npz",
                "process-1.npz",
            ]
            kept = read_tensors(out / name, multi)["params"]["wte.embedding"]
            assert kept.shape == (256, 64) and np.isfinite(kept).all()
        # summarized where the tensors live (jax_impl/summary.py)
        if name != "torch" and tensors == "auto":
            summaries = read_tensors(out / name, multi)["grads"].summaries
            assert summaries and all(s.on_device for s in summaries.values())
        # it ran every step
        assert "progress step=4" in (out / name / "processes" / "process-1.log").read_text()
    assert (
        read_record(out / "torch")
        .extra.notes["mesh_strategy"]
        .startswith("data parallel over 2 processes")
    )
    assert "| devices / processes | 4 / 2 | 2 / 2 | 4 / 2 |" in (out / "report.md").read_text()


def test_two_hosts_simulated_on_this_machine_write_one_report(jax_single, tmp_path):
    """The same command on two "hosts" (two compares, --host-id 0 and 1, their coordinator on
    127.0.0.1), one jax process each (compare/runs/hosts.py): one run of two processes; host 0
    writes the one report, host 1 none."""
    import json
    import socket
    import subprocess
    import sys

    from tests.helpers import REPO, process_env

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "compare",
        "--quiet",
        "--backend",
        "jax",
        "--spec",
        "gpt-tiny",
        "--steps",
        "5",
        "--mesh",
        "data=2",
        "--num-hosts",
        "2",
        "--coordinator",
        f"127.0.0.1:{port}",
    ]
    hosts = [
        subprocess.Popen(
            [*command, "--host-id", str(i), "--out", str(tmp_path / f"host{i}")],
            cwd=REPO,
            env=process_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [host.communicate(timeout=300) for host in hosts]
    assert [host.returncode for host in hosts] == [0, 0], outputs
    report = json.loads((tmp_path / "host0" / "report.json").read_text())
    record = read_record(tmp_path / "host0" / "jax")
    assert report["verdict"] == "pass" and report["backends"]["jax"]["losses"] == record.losses
    assert report["hosts"]["hosts"] == 2 and "rerun it on one host" in report["hosts"]["not_made"]
    assert record.platform["process_count"] == 2 and record.platform["device_count"] == 2
    assert max_loss_diff(read_record(jax_single("gpt-tiny")), record) < 1e-5
    follower = tmp_path / "host1"
    assert (
        not (follower / "report.json").exists() and not (follower / "jax" / "record.json").exists()
    )
    assert outputs[1][0].strip() == "host 1 of 2: ran jax; host 0 writes the report"
    # its process ran every step
    assert "progress step=4" in (follower / "jax" / "stdout.log").read_text()


def test_parity_tensors_are_canonical(jax_single):
    from common.files.tensor_file import read_tensors
    from common.presets import load_spec

    rec = read_record(jax_single("cnn-digits"))
    tensors = read_tensors(jax_single("cnn-digits") / "record.json", rec)
    init = init_params(load_spec("cnn-digits").model, 0)
    assert set(tensors["grads"]) == set(tensors["params"]) == set(init)
    assert tensors["outputs"]["logits"].shape == (64, 10)
    assert float(tensors["outputs"]["loss"]) == pytest.approx(rec.losses[0], abs=1e-6)
    for name in init:
        assert tensors["params"][name].shape == init[name].shape
        assert not np.array_equal(tensors["params"][name], init[name])  # every tensor trained


def test_missing_framework_message(tmp_path):
    proc = run_cli("jax_impl", "--spec", "nope")
    assert proc.returncode == 2 and "unknown spec 'nope'" in proc.stderr

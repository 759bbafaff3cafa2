"""The PyTorch/XLA twin through `python -m torch_xla_impl`."""

import pytest

from common.files.record import read_record
from tests.helpers import max_loss_diff, run_cli, train

pytestmark = pytest.mark.slow

# Every strategy once at least, each family's tensor-parallel rule once: the MLP's, the CNN's
# channels and FSDP, gpt-tiny's Megatron heads with data parallel beside them (data parallel alone:
# test_program.py's --mesh data=2 run and xmp.spawn below). JAX's twin runs every mesh on every
# family (test_jax_backend.py).
MESHES = {
    "mlp-tiny": ("tensor=4",),
    "cnn-digits": ("fsdp=4", "tensor=4"),
    "gpt-tiny": ("data=2,tensor=2",),
}


@pytest.fixture
def single_device(shared_runs):
    """A preset's single-device run (5 steps), made once in the session: what the mesh and xmp.spawn
    runs must match."""

    def run(preset: str):
        folder = shared_runs(
            f"torch_xla-{preset}",
            lambda out: train("torch_xla_impl", out / "run", "--spec", preset, "--steps", "5"),
        )
        return read_record(folder / "run")

    return run


@pytest.mark.parametrize("preset", MESHES)
def test_spmd_runs_match_the_single_device_run(preset, single_device, tmp_path):
    single = single_device(preset)
    assert single.extra.notes["mode"] == "single" and single.platform["device_count"] == 1
    for mesh in MESHES[preset]:
        sharded = train(
            "torch_xla_impl",
            tmp_path / mesh.replace(",", "_"),
            "--spec",
            preset,
            "--steps",
            "5",
            "--mesh",
            mesh,
        )
        assert sharded.extra.notes["mode"] == "spmd" and sharded.platform["device_count"] == 4
        assert max_loss_diff(single, sharded) < 1e-5, (mesh, single.losses, sharded.losses)
        assert sharded.hlo_stats["reported_ops"]["all-reduce"] > 0  # really sharded


def test_fixed_shapes_compile_the_loop_once_and_pipelined_steps_add_none(tmp_path):
    proc = run_cli(
        "torch_xla_impl",
        "--spec",
        "mlp-tiny",
        "--steps",
        "10",
        "--throughput-steps",
        "6",
        "--out",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    rec = read_record(tmp_path)
    loop = [e for e in rec.compile_events if e.phase == "loop"]
    # the optimizer state exists before step 0 (torch_impl.optim.create_state)
    assert [e.step for e in loop] == [0]
    # the state's zeros, then the step
    assert [e.phase for e in rec.compile_events] == ["setup", "loop"]
    assert rec.recompile_causes == [] and rec.settle_steps == 1
    assert rec.extra.counters["UncachedCompile"] == 2 and rec.extra.counters["CachedCompile"] >= 14
    assert (
        rec.extra.notes["sync_api"] == "torch_xla.sync"
        and rec.extra.notes["step_api"] == "xm.optimizer_step"
    )
    assert len(rec.trace_ms) == 10 and all(0 < t for t in rec.trace_ms)
    assert rec.hlo_stats["reported_ops"]["dot"] > 0
    # the pipelined steps: no compile
    assert rec.throughput["steps"] == 6 and rec.throughput["steps_per_s"] > 0


def test_bad_spec_is_a_usage_error():
    proc = run_cli("torch_xla_impl", "--spec", "gpt-tiny", "--set", "model.n_heads=5")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: model.n_heads=5 does not divide model.d_model=64"


def test_xmp_spawn_two_replicas_match_the_single_device_run(single_device, tmp_path):
    single = single_device("mlp-tiny")
    args = (
        "--spec",
        "mlp-tiny",
        "--steps",
        "5",
        "--mode",
        "spawn",
        "--mesh",
        "data=2",
        "--parity",
        "--throughput-steps",
        "0",
    )
    out = tmp_path / "spawn"
    proc = run_cli("torch_xla_impl", "--out", str(out), *args)
    if (
        proc.returncode == 3
        and "rendezvous.cc" in proc.stderr
        and "Termination timeout" in proc.stderr
    ):
        # XLA's CPU rendezvous aborts when one replica thread's compile runs 10 s behind the other's
        # (the documented limit, docs/xmp-spawn-cpu.md; seen once in ~10 suite runs on 2 busy
        # cores): once more
        out = tmp_path / "spawn-again"
        proc = run_cli("torch_xla_impl", "--out", str(out), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    spawned = read_record(out)
    assert spawned.extra.notes["mode"] == "spawn" and spawned.extra.notes["replicas"] == 2
    assert spawned.extra.notes["step_api"].startswith("bucketed all-reduce with a channel id")
    # includes the check that both replicas ended with identical parameters
    assert spawned.status == "ok"
    assert max_loss_diff(single, spawned) < 1e-5, (single.losses, spawned.losses)
    assert spawned.tensors == "tensors.npz"


def test_xmp_spawn_one_replica(single_device, tmp_path):
    single = single_device("mlp-tiny")
    spawned = train(
        "torch_xla_impl",
        tmp_path / "spawn",
        "--spec",
        "mlp-tiny",
        "--steps",
        "5",
        "--mode",
        "spawn",
    )
    assert spawned.extra.notes["mode"] == "spawn" and spawned.extra.notes["replicas"] == 1
    assert spawned.extra.notes["step_api"] == "xm.optimizer_step"
    assert max_loss_diff(single, spawned) == 0.0  # the same program on the same device


@pytest.mark.parametrize(
    "mesh, message",
    [
        (
            "data=4",
            "--mode spawn on CPU runs one thread per replica: mesh data=4 exceeds the 2 cores here",
        ),
        ("data=1,tensor=2", "--mode spawn is data parallel only"),
    ],
)
@pytest.mark.error_case("spawn-mesh")
def test_xmp_spawn_refuses_what_it_cannot_run(mesh, message, tmp_path):
    import os

    if mesh == "data=4" and (os.cpu_count() or 1) != 2:
        pytest.skip("the message names this machine's core count")
    proc = run_cli(
        "torch_xla_impl",
        "--spec",
        "mlp-tiny",
        "--mode",
        "spawn",
        "--mesh",
        mesh,
        "--out",
        str(tmp_path / "run"),
    )
    assert proc.returncode == 2 and message in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ("--trace-mode", "dynamo"),
            "--trace-mode dynamo is not supported with --mode spawn (its CPU collectives need "
            "the lazy sync); use --mode spmd or --trace-mode lazy",
        ),
        (
            ("--set", "model.dropout=0.1", "--set", "train.dropout_masks=common"),
            "train.dropout_masks=common is not supported with --mode spawn (each replica sees "
            "only its slice of the "
            "batch); use --mode spmd",
        ),
    ],
)
@pytest.mark.error_case("spawn-trace-mode", "exact-spawn")
def test_xmp_spawn_refuses_other_trace_modes_and_common_masks(flags, message, tmp_path):
    proc = run_cli(
        "torch_xla_impl",
        "--spec",
        "gpt-tiny",
        "--mode",
        "spawn",
        "--mesh",
        "data=2",
        *flags,
        "--out",
        str(tmp_path / "run"),
    )
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: {message}"
    assert not (tmp_path / "run").exists()  # refused before the run directory is made


@pytest.mark.error_case("spawn-replica-fails")
def test_an_input_error_in_one_replica_is_raised_as_itself(tmp_path):
    """Replica 1 raises a DataError at once while replica 0 waits for it at the compile barrier:
    run_spawn raises that DataError (exit 2 through the CLI), not "a replica died", and in seconds,
    not at a timeout."""
    from tests.data.failing_replica import MESSAGE

    proc = run_cli("tests.data.failing_replica", str(tmp_path), timeout=180)
    assert proc.stdout.strip().splitlines()[-1] == f"DataError: {MESSAGE}", proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []  # the replicas' error notes are removed

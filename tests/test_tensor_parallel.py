"""shard_map twins (Twin.nnx_mesh_arg, Twin.torch_mesh_arg, Twin.mesh, compare/judge/shards.py): a
Megatron-style tensor-parallel decoder, torch's per-rank code (on one process, or as 4 gloo ranks)
against `jax.shard_map` regions on 4 CPU devices (examples/tensor_parallel); a psum left out, over
the wrong axis, and a column shard taken from the wrong rank, each named at its module with the
devices that part."""

import json
import shutil

import numpy as np
import pytest

from common.twin import Twin, TwinError
from common.twin.fields import check_fields
from compare.judge.shards import device_check, device_coordinates, devices_outside, shard_of
from tests.helpers import REPO, run_cli

TP = "examples/tensor_parallel/twin.py"


def test_each_device_holds_the_block_its_partition_spec_gives_it():
    mesh = {"data": 2, "fsdp": 1, "tensor": 2}
    assert device_coordinates(mesh)[3] == {"data": 1, "fsdp": 0, "tensor": 1}
    # a column-parallel kernel (in, out): device 3 holds the second half of the columns
    assert shard_of((4, 8), [None, "tensor"], mesh, device_coordinates(mesh)[3]) == (
        slice(0, 4),
        slice(4, 8),
    )
    # a dimension over two axes: data-major blocks
    assert shard_of((8,), [["data", "tensor"]], mesh, device_coordinates(mesh)[2]) == (slice(4, 6),)
    ref = np.zeros((4, 8))
    other = ref.copy()
    other[:, 5] = 1.0  # inside the tensor-1 columns: devices 1 and 3 hold it
    assert devices_outside(ref, other, [None, "tensor"], mesh, 0.5) == [1, 3]
    assert devices_outside(ref, other, [None, "tensor"], mesh, 2.0) == []


def test_replicas_apart_by_rounding_are_not_a_missing_collective():
    from types import SimpleNamespace

    def record(backend):
        return SimpleNamespace(backend=backend, extra=SimpleNamespace(shards=None))

    apart = {
        "layers.0.mlp": {"devices": [1, 2, 3], "max_abs": 0.05},
        "layers.0.attn": {"devices": [1], "max_abs": 1e-9},  # a summation order's rounding
    }
    found = device_check(
        record("jax"),
        record("torch"),
        {"activations_replicas_differ": apart},
        {},
        {},
        {"atol": 1e-6, "rtol": 1e-5},
    )
    assert list(found["replicas_differ"]["jax"]) == ["layers.0.mlp"]
    rounding_only = {"activations_replicas_differ": {"layers.0.attn": apart["layers.0.attn"]}}
    assert (
        device_check(record("jax"), record("torch"), rounding_only, {}, {}, {"atol": 1e-6}) is None
    )


def test_a_twins_mesh_names_known_axes_and_its_mesh_keyword_an_identifier():
    base = {"torch": "t.py:m", "nnx": "n.py:m"}
    check_fields(Twin(**base, mesh={"tensor": 4}, nnx_mesh_arg="mesh"), "t")
    for bad in ({"model": 2}, {"tensor": 0}, {"tensor": True}):
        with pytest.raises(TwinError, match="the mesh maps axes of data, fsdp, tensor"):
            check_fields(Twin(**base, mesh=bad), "t")
    with pytest.raises(TwinError, match="nnx_mesh_arg='a mesh' must be the name"):
        check_fields(Twin(**base, nnx_mesh_arg="a mesh"), "t")
    with pytest.raises(TwinError, match="for a twin whose NNX side takes the mesh too"):
        check_fields(Twin(**base, torch_mesh_arg="mesh"), "t")


@pytest.mark.slow
@pytest.mark.error_case("twin-mesh-indivisible", "twin-factory-fails")
def test_a_mesh_the_model_does_not_split_over_or_a_mesh_keyword_not_named_is_refused(tmp_path):
    """Both found while the sides describe themselves: exit 2, one line, no run directory."""
    for mesh, words in (
        ("tensor=3", "not evenly divisible by the corresponding mesh axis sizes"),
        ("tensor=8", "cannot reshape array"),  # 4 heads over 8 devices
    ):
        out = tmp_path / mesh
        result = run_cli(
            "compare",
            "--twin",
            f"{TP}:tp_decoder",
            "--backend",
            "jax,torch",
            "--mesh",
            mesh,
            "--out",
            str(out),
        )
        assert result.returncode == 2, result.stderr[-2000:]
        line = result.stderr.strip()
        assert "\n" not in line and words in line and "Traceback" not in line
        assert f"its NNX forward does not run on the mesh data=1,fsdp=1,{mesh}" in line
        assert line.endswith("give a --mesh they divide (the twin's own: tensor=4)")
        assert not out.exists()
    folder = tmp_path / "edited"
    shutil.copytree(REPO / "examples/tensor_parallel", folder)

    def refused_with(*edits: tuple[str, str]) -> str:
        """The example's twin file edited, refused before any run directory: its line."""
        twin = (REPO / TP).read_text()
        for old, new in edits:
            twin = twin.replace(old, new)
        (folder / "twin.py").write_text(twin)
        out = tmp_path / "x"
        result = run_cli(
            "compare",
            "--twin",
            f"{folder}/twin.py:tp_decoder",
            "--backend",
            "jax,torch",
            "--out",
            str(out),
        )
        assert result.returncode == 2 and not out.exists(), result.stderr[-2000:]
        return result.stderr.strip()

    # the twin without its mesh keywords: the factory's own error, and where the keyword comes from
    line = refused_with(('    nnx_mesh_arg="mesh",\n', ""), ('    torch_mesh_arg="mesh",\n', ""))
    assert "missing 1 required keyword-only argument: 'mesh' (it requires mesh" in line
    assert "the twin's nnx_mesh_arg='mesh' for the run's device mesh" in line
    # a mesh keyword the factory does not take, named by the twin: the field is named
    line = refused_with(('torch_mesh_arg="mesh"', 'torch_mesh_arg="device_mesh"'))
    assert line.endswith(
        "(it takes no keyword 'device_mesh', which the twin's torch_mesh_arg names: name the "
        "factory's own keyword there)"
    )


def compare(tmp_path, twin: str, *args):
    out = tmp_path / twin
    result = run_cli(
        "compare", "--twin", f"{TP}:{twin}", "--out", str(out), "--quiet", *args, timeout=900
    )
    return result, json.loads((out / "report.json").read_text())


@pytest.mark.slow
def test_the_tensor_parallel_decoder_passes_on_every_runtime_on_four_devices(tmp_path):
    result, report = compare(tmp_path, "tp_decoder", "--backend", "all")
    assert result.returncode == 0, result.stderr[-2000:]
    assert all(p["passed"] and p["devices"] is None for p in report["parity"].values())
    record = json.loads((tmp_path / "tp_decoder" / "jax" / "record.json").read_text())
    # the twin's mesh: four devices, each parameter placed as the regions' in_specs take it
    assert record["extra"]["shards"]["mesh"] == {"data": 1, "fsdp": 1, "tensor": 4}
    placed = record["extra"]["shards"]["params"]
    assert placed["layers.0.mlp.fc1.kernel"] == [None, "tensor"]
    assert placed["layers.0.attn.o_proj.kernel"] == ["tensor", None]


@pytest.mark.slow
def test_the_decoder_passes_per_device_against_four_gloo_ranks(tmp_path):
    """torch's per-rank code as 4 processes (torch.distributed on gloo, its DeviceMesh given by the
    twin's torch_mesh_arg) against the regions on 4 devices of 4 JAX processes, module by module."""
    result, report = compare(
        tmp_path, "tp_decoder", "--backend", "jax,torch", "--processes", "4", "--activations"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    parity = report["parity"]["torch"]
    assert parity["passed"] and parity["devices"] is None
    located = parity["first_divergent_module"]
    assert located["module"] is None and located["modules_compared"] == 14
    assert located["modules_diverging"] == 0
    for backend in ("jax", "torch"):
        run = json.loads((tmp_path / "tp_decoder" / backend / "record.json").read_text())
        assert run["platform"]["process_count"] == 4
    assert (
        "one rank per device of the mesh tp, the rows split 1 way(s)"
        in run["extra"]["mesh_strategy"]
    )


@pytest.mark.slow
def test_a_psum_left_out_over_the_wrong_axis_or_from_the_wrong_rank_is_named(tmp_path):
    """The same named module and devices whether torch's per-rank code runs on one process or as 4
    gloo ranks (the psum over `data`: both sides as 4 processes, JAX's regions over 4 processes'
    devices): the suite runs the other two on one process each."""
    args = ("--backend", "jax,torch", "--activations")
    result, report = compare(tmp_path, "tp_missing_psum", *args)
    assert result.returncode == 1
    parity = report["parity"]["torch"]
    assert parity["first_divergent_module"]["module"] == "layers.0.mlp"
    replicas = parity["devices"]["replicas_differ"]["jax"]
    assert next(iter(replicas)) == "layers.0.mlp"  # the first, in the order modules finished
    assert replicas["layers.0.mlp"]["devices"] == [1, 2, 3]
    assert "attn" not in " ".join(replicas)  # the attention's psum is there
    assert "jax's layers.0.mlp holds other values on devices 1, 2, 3" in report["message"]

    # on data=2, tensor=2: a sum over the batch's halves, each tensor rank its own partial; torch's
    # ranks two tensor groups of 2, each its half of the rows
    result, report = compare(tmp_path, "tp_psum_over_data", *args, "--processes", "4")
    assert result.returncode == 1
    replicas = report["parity"]["torch"]["devices"]["replicas_differ"]["jax"]
    assert replicas["layers.0.mlp"]["devices"] == [1, 3]
    torch_run = json.loads((tmp_path / "tp_psum_over_data/torch/record.json").read_text())
    assert torch_run["platform"]["process_count"] == 4
    assert "per-rank code on 4 processes" in torch_run["extra"]["mesh_strategy"]
    assert "the rows split 2 way(s)" in torch_run["extra"]["mesh_strategy"]

    # every replica agrees (the psum is there) while the sum is of the wrong shards
    result, report = compare(tmp_path, "tp_wrong_rank", *args)
    assert result.returncode == 1
    parity = report["parity"]["torch"]
    assert parity["first_divergent_module"]["module"] == "layers.0.mlp"
    devices = parity["devices"]
    assert devices["replicas_differ"] == {} and devices["first_divergent_device"] == 0
    assert devices["tensors"]["grads/layers.0.mlp.fc1.kernel"] == [0, 1, 2, 3]
    assert "first divergent module layers.0.mlp, first divergent device 0" in report["message"]

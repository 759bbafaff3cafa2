import json

import numpy as np
import pytest

from common.files.record import (
    CompileEvent,
    RecordError,
    RunExtra,
    RunRecord,
    StepRecord,
    finite_or_none,
    package_versions,
    read_record,
    write_record,
)
from common.files.tensor_file import read_tensors, write_tensors
from common.presets import load_spec


def _record(tmp_path) -> RunRecord:
    spec = load_spec("mlp-tiny")
    rec = RunRecord(
        backend="jax",
        spec=spec.to_dict(),
        versions=package_versions("jax"),
        numerics={"dtype": "float32", "matmul_precision": "highest"},
        steps=[StepRecord(0, 2.31, 5.0), StepRecord(1, finite_or_none(float("nan")), 1.5)],
        compile_events=[
            CompileEvent("train_step", 0.25, 0, "loop"),
            CompileEvent("init", 0.01, -1, "setup"),
        ],
    )
    rec.tensors = write_tensors(
        tmp_path,
        {
            "outputs": {"logits": np.arange(6.0).reshape(2, 3)},
            "params": {"head.bias": np.ones(10, np.float32)},
        },
    )
    return rec


def test_record_round_trip(tmp_path):
    rec = _record(tmp_path)
    path = write_record(tmp_path, rec)
    back = read_record(tmp_path)
    assert back == rec
    assert back.losses == [2.31, None]
    assert (
        back.compile_events[0].fun_name == "train_step" and back.compile_events[0].phase == "loop"
    )
    assert back.versions["numpy"] == np.__version__
    tensors = read_tensors(path, back)
    assert np.array_equal(tensors["outputs"]["logits"], np.arange(6.0).reshape(2, 3))
    assert tensors["params"]["head.bias"].dtype == np.float32
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json", "tensors.npz"]


def test_truncated_record_is_a_one_line_error(tmp_path):
    path = write_record(tmp_path, _record(tmp_path))
    path.write_text(path.read_text()[:100])
    with pytest.raises(RecordError, match="is not valid JSON") as err:
        read_record(path)
    assert "\n" not in str(err.value)


def test_wrong_schema_missing_and_malformed_records(tmp_path):
    path = write_record(tmp_path, _record(tmp_path))
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "schema_version": 1}))  # before the typed fields of schema 2
    with pytest.raises(
        RecordError, match=r"has schema_version 1; this toolkit reads 2 \(re-run the backend"
    ):
        read_record(path)
    path.write_text(json.dumps({k: v for k, v in raw.items() if k != "backend"}))
    with pytest.raises(RecordError, match="lacks the field 'backend'"):
        read_record(path)
    path.write_text(json.dumps({**raw, "steps": [{"step": 0}]}))
    with pytest.raises(RecordError, match="malformed entry"):
        read_record(path)
    with pytest.raises(RecordError, match="does not exist"):
        read_record(tmp_path / "nowhere")


def test_truncated_tensor_file_is_an_error(tmp_path):
    rec = _record(tmp_path)
    path = write_record(tmp_path, rec)
    data = (tmp_path / "tensors.npz").read_bytes()
    (tmp_path / "tensors.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(RecordError, match="corrupt or truncated"):
        read_tensors(path, rec)


def test_non_finite_json_is_refused(tmp_path):
    rec = _record(tmp_path)
    rec.throughput = {"steps_per_s": float("inf")}
    with pytest.raises(ValueError):
        write_record(tmp_path, rec)
    assert not (tmp_path / "record.json").exists()  # nothing half-written


@pytest.mark.error_case("shards-foreign")
def test_a_tensor_kept_as_shards_is_assembled_from_its_own_runs_files_only(tmp_path):
    """A multi-process run's whole tensor (common/files/shards.py): each process writes its distinct
    shards, the tensor file marks it; read back whole, tensor by tensor. Shard files of another run,
    or one missing, are refused in one line: never mixed in, never read as zeros."""
    from types import SimpleNamespace

    from common.files.shards import ShardedTensor, shard_file, write_shards

    full = np.arange(48, dtype=np.float32).reshape(6, 8)
    halves = [((0, 3), (0, 8)), ((3, 6), (0, 8))]

    def share(process: int, run: int = 7) -> ShardedTensor:
        (r0, r1), (c0, c1) = halves[process]
        return ShardedTensor((6, 8), ((halves[process], full[r0:r1, c0:c1]),), process, 2, run)

    for process in (0, 1):
        write_shards(
            tmp_path, {"params": {"w": share(process)}, "outputs": {"loss": np.float32(1.5)}}
        )
    record = SimpleNamespace(tensors=write_tensors(tmp_path, {"params": {"w": share(0)}}))
    read = read_tensors(tmp_path, record)["params"]
    assert "w" in read and np.array_equal(read["w"], full)
    write_shards(tmp_path, {"params": {"w": share(1, run=8)}})  # process 1's file now another run's
    with pytest.raises(
        RecordError,
        match=r"shard file .*process-1\.npz belongs to another run \(its run \[8, 2, 1\], "
        r"this run \[7, 2, 1\]\); its values are never mixed into this one",
    ):
        read_tensors(tmp_path, record)
    shard_file(tmp_path, 1).unlink()
    with pytest.raises(RecordError, match=r"^params/w: its shards cover 24 of its 48 elements"):
        read_tensors(tmp_path, record)["params"]["w"]


def test_extra_is_typed_and_record_json_keeps_its_keys_in_order(tmp_path):
    """RunRecord.extra is a RunExtra (issue 44): the driver's facts as fields, the runtime's notes
    apart; record.json holds the same object as before, keys and order (the notes first, then the
    facts a run set), and reads back."""
    raw = {
        "step_api": "jax.jit(...)",
        "mesh_strategy": "replicated",
        "nnx_input_axes": [],
        "tensors": "summary",
        "start": {"from": "canonical init"},
        "provoked": [],
        "loss": "the task's (lm)",
    }
    rec = _record(tmp_path)
    rec.extra = RunExtra.from_dict(raw)
    assert rec.extra.tensors == "summary" and rec.extra.notes == {k: raw[k] for k in list(raw)[:3]}
    assert rec.extra.capture_at is None and rec.extra.decisions is None  # not set: not written
    write_record(tmp_path, rec)
    written = json.loads((tmp_path / "record.json").read_text())["extra"]
    assert list(written.items()) == list(raw.items())
    assert read_record(tmp_path).extra == rec.extra


def test_a_record_whose_extra_is_not_an_object_is_refused(tmp_path):
    write_record(tmp_path, _record(tmp_path))
    raw = json.loads((tmp_path / "record.json").read_text())
    (tmp_path / "record.json").write_text(json.dumps({**raw, "extra": ["a list"]}))
    with pytest.raises(RecordError, match="has a malformed entry: extra is list, not an object"):
        read_record(tmp_path)

"""bfloat16 bounds from measured noise (compare/noise_floor.py), on hand-made runs: a tensor is within
max(FACTOR * the larger of the two runs' own bf16-vs-fp32 distances, its float32 bound)."""
import numpy as np
import pytest

from common.presets import load_spec
from common.record import read_record
from compare import noise_floor
from compare.noise_floor import FACTOR, FloorRun, Floors
from compare.parity import compare_tensors
from compare.tolerances import load_policy

FP32 = load_policy("default", "float32")


def runs(other_noise: float, port_error: float = 0.0):
    """The reference and another backend in bf16 and each one's float32 run: the float32 runs agree (plus a
    port error on the other side, in both its runs), each bf16 run is its float32 run plus its own rounding."""
    rng = np.random.default_rng(0)
    exact = {"grads": {"w": rng.standard_normal(64)}, "params": {"w": rng.standard_normal(64)}}
    shift = lambda t, size: {g: {k: v + size * rng.standard_normal(v.shape) for k, v in d.items()}  # noqa: E731
                             for g, d in t.items()}
    other_fp32 = {g: {k: v + port_error for k, v in d.items()} for g, d in exact.items()}
    return exact, shift(exact, 1e-3), other_fp32, shift(other_fp32, other_noise)


def judged(other_noise: float, port_error: float = 0.0) -> dict:
    ref_fp32, ref, other_fp32, other = runs(other_noise, port_error)
    tensors = compare_tensors(ref, other, load_policy("default", "bfloat16"))
    floors = Floors(FloorRun([], ref_fp32), FloorRun([], other_fp32), FP32)
    noise_floor.judge_tensors(tensors, ref, other, floors)
    return {"tensors": tensors, "noise": {k: max(float(np.max(np.abs(ref[g][n] - ref_fp32[g][n]))),
                                                 float(np.max(np.abs(other[g][n] - other_fp32[g][n]))))
                                          for k in tensors for g, _, n in [k.partition("/")]}}


def test_each_tensor_is_bounded_by_the_larger_of_the_two_runs_own_noise():
    for other_noise in (1e-3, 5e-3):  # like the reference's, or five times it (a runtime accumulating in bf16)
        result = judged(other_noise)
        for key, row in result["tensors"].items():
            noise = result["noise"][key]
            assert row["judged_by"] == "noise-floor" and row["noise"] == pytest.approx(noise), key
            assert row["bound"] == pytest.approx(max(FACTOR * noise, FP32[row["kind"]]["atol"] + FP32[row["kind"]][
                "rtol"] * np.max(np.abs(runs(other_noise)[1][key.split("/")[0]]["w"]))))
            assert row["within"] and row["abs"] <= row["bound"] and "passes_with" not in row, (key, row)
            assert row["over"] == 0 and row["elements"] == 64


def test_a_port_error_moves_both_runs_of_its_side_and_still_fails():
    result = judged(1e-3, port_error=0.05)  # 0.05 off in fp32 and bf16 alike: its own noise stays 1e-3
    for key, row in result["tensors"].items():
        assert row["noise"] < 0.01 and not row["within"] and row["abs"] > 0.04, (key, row)
        assert row["over"] == 64  # every element is off by the port's 0.05, beyond 3x a noise of ~3e-3


def test_a_steps_loss_is_bounded_by_the_largest_loss_noise_so_far():
    ref_fp32, ref = [2.0, 1.9, 1.8, 1.7], [2.001, 1.903, 1.801, 1.70]  # noise 1e-3, 3e-3, 1e-3, 0
    other_fp32, other = [2.0, 1.9, 1.8, 1.7], [2.002, 1.905, 1.795, 1.66]
    floors = Floors(FloorRun(ref_fp32, {}), FloorRun(other_fp32, {}), FP32)
    loss = {"per_step_abs": [abs(a - b) for a, b in zip(ref, other)], "first_divergent_step": 0, "max_abs": 0.04}
    judged = noise_floor.judge_losses(loss, ref, other, floors)
    # the largest noise of either run so far: 2e-3 (the other's, step 0), then 5e-3 (step 1), kept at step 2
    assert judged["bounds"][:3] == pytest.approx([FACTOR * 2e-3, FACTOR * 5e-3, FACTOR * 5e-3])
    assert judged["first_divergent_step"] is None and judged["judged_by"] == "noise-floor"
    drifted = {**loss, "per_step_abs": [0.001, 0.002, 0.02, 0.0]}  # step 2 beyond 3 x 5e-3
    assert noise_floor.judge_losses(drifted, ref, other, floors)["first_divergent_step"] == 2


@pytest.mark.parametrize("floor_run_id, judged", [("in-process", True), ("earlier", False)])
def test_only_this_runs_float32_runs_set_the_floor(tmp_path, floor_run_id, judged):
    """A noise-floor/ folder another compare run left (another run id) is never read as this run's floor: its
    pairs are judged by the fixed bounds, and the report says why."""
    from common.record import write_record
    from compare.report import ReportInputs
    from tests.test_report_in_process import NAMES, RUN_ID, build_report, write_run

    runs = {n: write_run(tmp_path / n, n) for n in NAMES}
    for n in NAMES:  # the float32 runs: the same tensors, under a run id of this run or of an earlier one
        write_run(tmp_path / "noise-floor" / n, n)
        record = read_record(tmp_path / "noise-floor" / n)
        record.run_id = floor_run_id
        write_record(tmp_path / "noise-floor" / n, record)
    bf16 = load_spec("mlp-tiny", ["train.steps=3", "train.dtype=bfloat16"])  # the report's spec: judged in bf16
    inputs = ReportInputs(bf16, load_policy("default", "bfloat16"), NAMES, "jax", tmp_path, RUN_ID,
                          bf16_tolerance="noise-floor")
    report = build_report(inputs, runs, False)
    policy, rows = report["tolerance_policy"], report["parity"]["torch"]["tensors"]
    assert policy["policy"] == "noise-floor"
    if judged:
        assert policy["not_measured"] == {} and rows["grads/layers.0.kernel"]["judged_by"] == "noise-floor"
        assert rows["grads/layers.0.kernel"]["noise"] == 0.0  # each float32 run equals its own run here
    else:
        assert set(policy["not_measured"]) == {"jax", "torch"}
        assert "belongs to run earlier, not to this run in-process" in policy["not_measured"]["torch"]
        assert all("judged_by" not in row for row in rows.values())
    assert report["verdict"] == "pass"

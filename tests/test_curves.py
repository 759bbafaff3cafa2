"""The long-run check of bfloat16 loss curves (compare/judge/curves.py), on curves measured here:
gpt-tiny, 300 steps of the Python language reference in bfloat16, JAX against eager torch
(tests/data/bf16_loss_curves.json says the command). No backend runs."""

import json
from pathlib import Path

import numpy as np
import pytest

from common.files.record import RunRecord, write_record
from common.files.tensor_file import write_tensors
from common.presets import load_spec
from common.vocab import BackendStatus, ReportStatus
from compare.judge.curves import WINDOW, compare_curves, curves_words
from compare.judge.noise_floor import FLOOR_DIR, FloorRun, Floors
from compare.judge.parity import check_parity
from compare.judge.tolerances import load_policy
from compare.reporting.plots import write_plots
from compare.reporting.render import markdown
from compare.reporting.report import ReportInputs, build_report
from compare.runs.orchestrate import BackendRun

CURVES = json.loads((Path(__file__).parent / "data" / "bf16_loss_curves.json").read_text())
FP32 = load_policy("default", "float32")
SPEC = load_spec("gpt-tiny", ["train.steps=300", "train.dtype=bfloat16"])


def test_the_band_and_the_parting_step_by_hand():
    # window 2, span 2: the reference's own wander |mean(ref - fp32)| is 0.05, 0.05, 0 and the
    # other's 0.02, 0, 0 -> band 3 x 0.05 = 0.15 at every step; the gap mean(other - ref) is 0, 0,
    # 0.2: over from the third average, which ends at step 3
    loose = {"atol": 1e-6, "rtol": 0.0}
    found = compare_curves(
        [1.0, 1.0, 1.0, 1.0],
        [1.0, 1.0, 1.0, 1.4],
        [1.0, 1.1, 1.0, 1.0],
        [1.0, 0.96, 1.0, 1.4],
        loose,
        window=2,
        span=2,
    )
    assert found["band"] == pytest.approx([0.15, 0.15, 0.15]) and found["gap"] == pytest.approx(
        [0.0, 0.0, 0.2]
    )
    assert (found["parts_at"], found["steps_over"], found["within"]) == (3, 1, False)
    assert found["worst_share"] == pytest.approx(0.2 / 0.15) and found[
        "final_gap"
    ] == pytest.approx(0.2)
    # the other run's own wander widens the band: 0.1 at the end -> 0.3, over the gap
    assert compare_curves(
        [1.0] * 4, [1.0, 1.0, 1.0, 1.4], [1.0] * 4, [1.0, 1.0, 1.0, 1.2], loose, window=2, span=2
    )["band"] == pytest.approx([1e-6, 1e-6, 0.3])
    # the band forgets: with span 1 the last average's own noise (0) leaves only the float32 bound
    assert (
        compare_curves(
            [1.0] * 4,
            [1.0, 1.0, 1.0, 1.0001],
            [1.0, 1.1, 1.0, 1.0],
            [1.0, 1.0, 1.0, 1.0001],
            loose,
            window=2,
            span=1,
        )["parts_at"]
        == 3
    )
    # short
    assert (
        compare_curves([1.0] * 4, [1.0] * 4, [1.0] * 4, [1.0] * 4, loose, window=2, span=5) is None
    )
    assert (
        compare_curves(
            [1.0, None, 1.0, 1.0], [1.0] * 4, [1.0] * 4, [1.0] * 4, loose, window=2, span=2
        )
        is None
    )


def test_a_correct_port_stays_within_its_band_for_300_steps():
    found = compare_curves(
        CURVES["jax_bfloat16"],
        CURVES["torch_bfloat16"],
        CURVES["jax_float32"],
        CURVES["torch_float32"],
        FP32["loss"],
    )
    assert found["within"] and found["parts_at"] is None and found["steps"] == 300
    assert len(found["gap"]) == 300 - WINDOW + 1
    assert found["worst_share"] == pytest.approx(0.3796, abs=1e-4)
    assert found["final_gap"] == pytest.approx(0.001536, abs=1e-6)  # torch ends 0.0015 above JAX
    assert found["final_band"] == pytest.approx(0.021322, abs=1e-6)


def test_a_correct_port_whose_bf16_run_settles_lower_is_not_blamed():
    """Seed 3: torch_xla's bfloat16 run parts from every other run by step 8 and trains ~0.1 lower
    for good, while its float32 run agrees with JAX's; the reference's wander alone would blame it
    (225 % of that band)."""
    c = {k.removeprefix("seed3_"): v for k, v in CURVES.items() if k.startswith("seed3_")}
    found = compare_curves(
        c["jax_bfloat16"],
        c["torch_xla_bfloat16"],
        c["jax_float32"],
        c["torch_xla_float32"],
        FP32["loss"],
    )
    assert found["within"] and found["worst_share"] == pytest.approx(0.4454, abs=1e-4)
    # it ends 0.12 lower: its own wander is as large
    assert found["final_gap"] == pytest.approx(-0.1202, abs=1e-4)
    alone = compare_curves(
        c["jax_bfloat16"],
        c["torch_xla_bfloat16"],
        c["jax_float32"],
        c["torch_xla_bfloat16"],
        # the other run's float32 twin replaced by itself: no wander of its own
        FP32["loss"],
    )
    assert alone["parts_at"] == 24 and alone["worst_share"] == pytest.approx(2.252, abs=1e-3)


def records(other: str) -> tuple[RunRecord, RunRecord]:
    spec, made = SPEC.to_dict(), []
    for backend, losses in (("jax", CURVES["jax_bfloat16"]), ("torch", CURVES[other])):
        record = RunRecord(
            backend=backend,
            spec=spec,
            numerics={"dtype": "bfloat16", "matmul_precision": "highest"},
        )
        for step, loss in enumerate(losses):
            record.add_step(step, loss, 1.0)
        made.append(record)
    return made[0], made[1]


def test_a_schedule_that_ends_elsewhere_parts_late_though_every_step_is_within_its_bound():
    """torch with min_lr_ratio 0 (the reference decays the lr to 10 % of its peak): every step's
    loss is within 3x the largest noise so far (the lr peak's), but from step 271 on the averaged
    curves are apart."""
    floors = Floors(
        FloorRun(CURVES["jax_float32"], {}),
        FloorRun(CURVES["torch_min_lr_ratio_0_float32"], {}),
        FP32,
    )
    ref, other = records("torch_min_lr_ratio_0_bfloat16")
    parity = check_parity(ref, other, {}, {}, load_policy("default", "bfloat16"), [], floors)
    curves = parity["curves"]
    assert (
        max(d / b for d, b in zip(parity["loss"]["per_step_abs"], parity["loss"]["bounds"])) < 0.35
    )
    assert (curves["parts_at"], parity["first_divergent_step"], parity["passed"]) == (
        271,
        271,
        False,
    )
    # it trains worse by 0.0275 at the end
    assert curves["final_gap"] == pytest.approx(0.02750, abs=1e-5)
    assert curves_words(curves) == (
        "loss curves part at step 271 (mean over 25 steps; it ends training worse by 0.0275, "
        "against a band of "
        "0.0152: 3x the larger of the two runs' own drifts from their noise-floor runs)"
    )
    # the correct port, judged the same way, passes
    floors = Floors(
        FloorRun(CURVES["jax_float32"], {}), FloorRun(CURVES["torch_float32"], {}), FP32
    )
    parity = check_parity(
        *records("torch_bfloat16"), {}, {}, load_policy("default", "bfloat16"), [], floors
    )
    assert (
        parity["passed"] and parity["curves"]["within"] and parity["first_divergent_step"] is None
    )


def write_run(directory: Path, backend: str, losses: list, dtype: str) -> BackendRun:
    """A finished run of 300 steps as a backend writes it: its record and a tensor file."""
    record = RunRecord(
        backend=backend,
        spec=SPEC.to_dict(),
        run_id="curves",
        numerics={"dtype": dtype, "matmul_precision": "highest"},
    )
    for step, loss in enumerate(losses):
        record.add_step(step, loss, 1.0)
    directory.mkdir(parents=True)
    record.tensors = write_tensors(
        directory, {"outputs": {"loss": np.asarray(losses[0], np.float32)}}
    )
    write_record(directory, record)
    return BackendRun(
        backend, directory, BackendStatus.OK, 0, "", 1.0, ["python", "-m", f"{backend}_impl"]
    )


def test_the_report_says_where_the_curves_part_and_draws_the_band(tmp_path):
    runs = {
        "jax": write_run(tmp_path / "jax", "jax", CURVES["jax_bfloat16"], "bfloat16"),
        "torch": write_run(
            tmp_path / "torch", "torch", CURVES["torch_min_lr_ratio_0_bfloat16"], "bfloat16"
        ),
    }
    write_run(tmp_path / FLOOR_DIR / "jax", "jax", CURVES["jax_float32"], "float32")
    write_run(
        tmp_path / FLOOR_DIR / "torch", "torch", CURVES["torch_min_lr_ratio_0_float32"], "float32"
    )
    inputs = ReportInputs(
        SPEC,
        load_policy("default", "bfloat16"),
        ["jax", "torch"],
        "jax",
        tmp_path,
        "curves",
        floor_policy="noise-floor",
    )
    report = build_report(inputs, runs, False)
    assert report["status"] == ReportStatus.PARITY_FAILED and report["not_built"] == []
    assert report["message"].startswith(
        "torch: parity failed: first divergent step 271, "
        + curves_words(report["parity"]["torch"]["curves"])
        + "; worst tensor outputs/loss"
    )
    assert (
        "| loss curves (mean over steps): end gap / band, parted at | +0.0275 / 0.0152 (25 "
        "steps), parted at "
        "step 271 |" in markdown(report)
    )
    assert write_plots(report, tmp_path) == ["loss.png", "loss_diff.png", "step_time.png"]

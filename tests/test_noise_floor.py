"""Bounds from measured noise (compare/judge/noise_floor.py), on hand-made runs: a tensor is within
max(FACTOR * the larger of the two runs' own distances to their floor runs, its float32 bound); and
a long float32 run on real text judged by its jittered floor."""

import json

import numpy as np
import pytest

from common.data.text import pydoc_text, write_tokens
from common.files.record import RunRecord, read_record
from common.presets import load_spec
from compare.judge import noise_floor
from compare.judge.messages import failure_message
from compare.judge.noise_floor import FACTOR, FLOOR_DIR, FloorRun, Floors, floor_needed
from compare.judge.parity import check_parity, compare_tensors
from compare.judge.tolerances import load_policy
from tests.helpers import judged_of, run_cli

FP32 = load_policy("default", "float32")


def runs(other_noise: float, port_error: float = 0.0):
    """The reference and another backend in bf16 and each one's float32 run: the float32 runs agree
    (plus a port error on the other side, in both its runs), each bf16 run is its float32 run plus
    its own rounding."""
    rng = np.random.default_rng(0)
    exact = {"grads": {"w": rng.standard_normal(64)}, "params": {"w": rng.standard_normal(64)}}
    shift = lambda t, size: {
        g: {k: v + size * rng.standard_normal(v.shape) for k, v in d.items()}  # noqa: E731
        for g, d in t.items()
    }
    other_fp32 = {g: {k: v + port_error for k, v in d.items()} for g, d in exact.items()}
    return exact, shift(exact, 1e-3), other_fp32, shift(other_fp32, other_noise)


def judged(other_noise: float, port_error: float = 0.0) -> dict:
    ref_fp32, ref, other_fp32, other = runs(other_noise, port_error)
    tensors = compare_tensors(ref, other, load_policy("default", "bfloat16"))
    floors = Floors(FloorRun([], ref_fp32), FloorRun([], other_fp32), FP32)
    noise_floor.judge_tensors(tensors, ref, other, floors)
    return {
        "tensors": tensors,
        "noise": {
            k: max(
                float(np.max(np.abs(ref[g][n] - ref_fp32[g][n]))),
                float(np.max(np.abs(other[g][n] - other_fp32[g][n]))),
            )
            for k in tensors
            for g, _, n in [k.partition("/")]
        },
    }


def test_each_tensor_is_bounded_by_the_larger_of_the_two_runs_own_noise():
    # like the reference's, or five times it (a runtime accumulating in bf16)
    for other_noise in (1e-3, 5e-3):
        result = judged(other_noise)
        for key, row in result["tensors"].items():
            noise = result["noise"][key]
            assert row["judged_by"] == "noise-floor" and row["noise"] == pytest.approx(noise), key
            assert row["bound"] == pytest.approx(
                max(
                    FACTOR * noise,
                    FP32[row["kind"]]["atol"]
                    + FP32[row["kind"]]["rtol"]
                    * np.max(np.abs(runs(other_noise)[1][key.split("/")[0]]["w"])),
                )
            )
            assert row["within"] and row["abs"] <= row["bound"] and "passes_with" not in row, (
                key,
                row,
            )
            assert row["over"] == 0 and row["elements"] == 64


def test_a_port_error_moves_both_runs_of_its_side_and_still_fails():
    # 0.05 off in fp32 and bf16 alike: its own noise stays 1e-3
    result = judged(1e-3, port_error=0.05)
    for key, row in result["tensors"].items():
        assert row["noise"] < 0.01 and not row["within"] and row["abs"] > 0.04, (key, row)
        # every element is off by the port's 0.05, beyond 3x a noise of ~3e-3
        assert row["over"] == 64


def test_a_steps_loss_is_bounded_by_the_largest_loss_noise_so_far():
    ref_fp32, ref = [2.0, 1.9, 1.8, 1.7], [2.001, 1.903, 1.801, 1.70]  # noise 1e-3, 3e-3, 1e-3, 0
    other_fp32, other = [2.0, 1.9, 1.8, 1.7], [2.002, 1.905, 1.795, 1.66]
    floors = Floors(FloorRun(ref_fp32, {}), FloorRun(other_fp32, {}), FP32)
    loss = {
        "per_step_abs": [abs(a - b) for a, b in zip(ref, other)],
        "first_divergent_step": 0,
        "max_abs": 0.04,
    }
    judged = noise_floor.judge_losses(loss, ref, other, floors)
    # the largest noise of either run so far: 2e-3 (the other's, step 0), then 5e-3 (step 1), kept
    # at step 2
    assert judged["bounds"][:3] == pytest.approx([FACTOR * 2e-3, FACTOR * 5e-3, FACTOR * 5e-3])
    assert judged["first_divergent_step"] is None and judged["judged_by"] == "noise-floor"
    drifted = {**loss, "per_step_abs": [0.001, 0.002, 0.02, 0.0]}  # step 2 beyond 3 x 5e-3
    assert noise_floor.judge_losses(drifted, ref, other, floors)["first_divergent_step"] == 2


# float32: --fp32-tolerance noise-floor's jittered runs
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("floor_run_id, judged", [("in-process", True), ("earlier", False)])
def test_only_this_runs_float32_runs_set_the_floor(tmp_path, floor_run_id, judged, dtype):
    """A noise-floor/ folder another compare run left (another run id) is never read as this run's
    floor: its pairs are judged by the fixed bounds, and the report says why; alike for either
    dtype's floor runs."""
    from common.files.record import write_record
    from compare.reporting.report import ReportInputs
    from tests.test_report_in_process import NAMES, RUN_ID, build_report, write_run

    runs = {n: write_run(tmp_path / n, n) for n in NAMES}
    # the float32 runs: the same tensors, under a run id of this run or of an earlier one
    for n in NAMES:
        write_run(tmp_path / "noise-floor" / n, n)
        record = read_record(tmp_path / "noise-floor" / n)
        record.run_id = floor_run_id
        write_record(tmp_path / "noise-floor" / n, record)
    # the report's spec: judged in dtype
    spec = load_spec("mlp-tiny", ["train.steps=3", f"train.dtype={dtype}"])
    inputs = ReportInputs(
        spec,
        load_policy("default", dtype),
        NAMES,
        "jax",
        tmp_path,
        RUN_ID,
        floor_policy="noise-floor",
    )
    report = build_report(inputs, runs, False)
    policy, rows = report["tolerance_policy"], report["parity"]["torch"]["tensors"]
    assert policy["policy"] == "noise-floor"
    if judged:
        assert (
            policy["not_measured"] == {}
            and rows["grads/layers.0.kernel"]["judged_by"] == "noise-floor"
        )
        # each float32 run equals its own run here
        assert rows["grads/layers.0.kernel"]["noise"] == 0.0
    else:
        assert set(policy["not_measured"]) == {"jax", "torch"}
        assert (
            "belongs to run earlier, not to this run in-process" in policy["not_measured"]["torch"]
        )
        assert all("judged_by" not in row for row in rows.values())
    assert report["verdict"] == "pass"


@pytest.mark.slow
def test_a_float32_run_made_chaotic_by_training_is_judged_by_its_jittered_floor(tmp_path):
    """gpt-tiny on the Python language reference, seed 3, lr 1e-2, JAX against eager torch in
    float32: training at that rate is chaotic, and from step ~12 on the two correct ports' rounding
    differences grow past the fixed bound (1e-4 + 5e-4 |loss|) at most steps, by 5x to 400x
    (measured with one and two OpenMP threads and with XLA's Eigen threads off: each CPU rounds
    otherwise, so the test asserts the property, not one CPU's numbers). With --fp32-tolerance
    noise-floor each backend runs once more from start weights 16 ulps off, and that run's drift
    bounds every step (the worst step used a third of it); step 0 keeps its float32 bounds."""
    tokens, out = tmp_path / "pydoc.bin", tmp_path / "run"
    write_tokens(tokens, pydoc_text())
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(out),
        "--backend",
        "jax,torch",
        "--set",
        "data.dataset=tokens-file",
        "--set",
        f"data.path={tokens}",
        "--set",
        "train.seed=3",
        "--set",
        "data.seed=3",
        "--set",
        "train.lr=1e-2",
        "--fp32-tolerance",
        "noise-floor",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["tolerance_policy"]["rule"].endswith(
        "noise = max|run - its own run from start weights 16 ulps off|"
    )
    floor = json.loads((out / FLOOR_DIR / "torch" / "spec.json").read_text())["train"]
    main = json.loads((out / "torch" / "spec.json").read_text())["train"]
    assert (floor.pop("start_jitter_ulps"), main.pop("start_jitter_ulps")) == (
        16,
        0,
    ) and floor == main
    loss, ref = report["parity"]["torch"]["loss"], report["backends"]["jax"]["losses"]
    fixed = load_policy("default", "float32")["loss"]
    fixed_bounds = [fixed["atol"] + fixed["rtol"] * abs(loss_s) for loss_s in ref]
    over = [s for s, d in enumerate(loss["per_step_abs"]) if d > fixed_bounds[s]]
    # fixed fails it
    assert len(over) >= 10 and max(loss["per_step_abs"][s] / fixed_bounds[s] for s in over) > 5
    losses = {
        (side, run): [
            s["loss"] for s in json.loads((out / d / side / "record.json").read_text())["steps"]
        ]
        for side in ("jax", "torch")
        for run, d in (("main", "."), ("floor", FLOOR_DIR))
    }
    noise = np.maximum.accumulate(
        np.max(
            [
                np.abs(np.subtract(losses[side, "floor"], losses[side, "main"]))
                for side in ("jax", "torch")
            ],
            axis=0,
        )
    )
    assert loss["bounds"][1:] == pytest.approx(
        [max(3 * n, b) for n, b in zip(noise[1:], fixed_bounds[1:])]
    )
    assert (
        all(d < b for d, b in zip(loss["per_step_abs"], loss["bounds"]))
        and loss["first_divergent_step"] is None
    )
    step0 = report["parity"]["torch"]["tensors"]["grads/blocks.0.mlp.fc.kernel"]
    # its float32 bound
    assert step0["judged_by"] == "noise-floor" and step0["noise"] < step0["bound"] / 10


def test_a_pair_that_parts_after_an_agreeing_step_0_without_a_floor_is_told_how_to_measure_one():
    spec = load_spec("mlp-tiny", ["train.steps=3"]).to_dict()
    made = {}
    for backend, losses in (("jax", [2.3, 2.2, 2.1]), ("torch", [2.3, 2.2, 2.5])):
        record = RunRecord(
            backend=backend, spec=spec, numerics={"dtype": "float32", "matmul_precision": "highest"}
        )
        for step, loss in enumerate(losses):
            record.add_step(step, loss, 1.0)
        made[backend] = record
    parity = check_parity(made["jax"], made["torch"], {}, {}, FP32, [])
    assert (
        parity["first_divergent_step"] == 2
        and parity["unmeasured_noise"] == "--fp32-tolerance noise-floor"
    )
    assert failure_message("torch", parity) == (
        "torch: parity failed: first divergent step 2 (step 0 agreed and no noise floor was "
        "measured: --fp32-tolerance "
        "noise-floor tells rounding that training grew from a port error)"
    )
    routed = {
        **parity,
        "decisions": {
            "matched": True,
            "flipped": 0,
            "decisions": [
                {"module": "blocks.0.moe.router", "flipped": 0},
                {"module": "blocks.1.moe.router", "flipped": 0},
            ],
        },
    }
    assert failure_message("torch", routed).endswith(
        "from a port error; the model makes 2 discrete choices (top-k, argmax, sort; first in "
        "blocks.0.moe.router), "
        "all alike at step 0, and a tie flipped by rounding at a later step parts the runs by "
        "design: their choices "
        "at that step were not captured)"
    )
    floors = Floors(FloorRun([2.3, 2.2, 2.1], {}), FloorRun([2.3, 2.2, 2.5], {}), FP32)
    # a floor measured: no hint
    judged = check_parity(made["jax"], made["torch"], {}, {}, FP32, [], floors)
    assert judged["unmeasured_noise"] is None and judged["first_divergent_step"] == 2


def test_a_float32_pair_is_floored_only_where_fixed_bounds_fail_unexplained():
    """compare/judge/noise_floor.py floor_needed: a trained ResNet's step-0 convolution gradients
    out by rounding while all 28 modules agree, forward and backward, is measured, and so is a pair
    that parts after a step 0 that agreed in everything; a module named, a loss, an output or
    choices that differ, or a module left uncompared are located failures, and are not."""

    def report(**change):
        tensors = {
            "grads/layer2.layers.0.conv2.kernel": {"within": False},
            "outputs/logits": {"within": True},
        }
        parity = {
            "passed": False,
            "comparable": True,
            "decisions": None,
            "distribution": None,
            "tensors": tensors,
            "first_divergent_module": {"module": None, "modules_compared": 28, "not_compared": {}},
            "first_divergent_module_backward": {
                "module": None,
                "in_loss": False,
                "modules_compared": 28,
            },
        }
        for key, value in change.items():
            merged = isinstance(value, dict) and isinstance(parity[key], dict) and key != "tensors"
            parity[key] = {**parity[key], **value} if merged else value
        return {"torch": parity}

    assert list(floor_needed(judged_of(report()))) == ["torch"]
    assert floor_needed(judged_of(report()))["torch"].startswith(
        "the fixed bounds failed 1 step-0 gradient or trained"
    )
    assert floor_needed(judged_of(report(), dtype="bfloat16")) == {}
    assert floor_needed(judged_of(report(), policy="noise-floor")) == {}
    later = report(
        unmeasured_noise="--fp32-tolerance noise-floor",
        first_divergent_step=4,
        tensors={"params/fc.kernel": {"within": False}, "eval/logits": {"within": False}},
    )
    assert floor_needed(judged_of(later)) == {
        "torch": "the runs parted at step 4 after a step 0 that agreed in everything "
        "(training grows rounding as it grows a port error)"
    }
    located = [
        {"first_divergent_module": {"module": "layer2.layers.0.conv1"}},
        {"first_divergent_module": {"in_loss": "the loss computed from the model's outputs"}},
        {"first_divergent_module": {"not_compared": {"head": "no NNX module"}}},
        {"first_divergent_module_backward": {"module": "layer2"}},
        {"first_divergent_module_backward": {"modules_compared": 0}},
        {"decisions": {"flipped": 3}},
        {"tensors": {"grads/fc.kernel": {"within": False}, "outputs/logits": {"within": False}}},
        {"tensors": {"state/bn1.mean": {"within": False}}},
        {"passed": True},
    ]
    for change in located:
        assert floor_needed(judged_of(report(**change))) == {}, change


@pytest.mark.slow
def test_a_float32_pair_parting_after_step_0_is_floored_and_a_port_error_still_fails(
    tmp_path,
):
    """No flag: torch's learning rate set 5 % apart (a one-sided --torch-set, so the runs stay
    comparable) parts the runs after a step 0 that agreed in everything; compare measures the pair's
    floor by itself (the reference and torch once more from jittered weights) and the difference
    still fails by it."""
    out = tmp_path / "run"
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(out),
        "--spec",
        "mlp-tiny",
        "--backend",
        "jax,torch",
        "--steps",
        "5",
        "--torch-set",
        "train.lr=0.00105",
    )
    report = json.loads((out / "report.json").read_text())
    assert proc.returncode == 1, report["message"]
    parity = report["parity"]["torch"]
    step = parity["first_divergent_step"]
    assert step > 0 and parity["unmeasured_noise"] is None
    assert report["tolerance_policy"]["policy"] == "noise-floor"
    assert report["tolerance_policy"]["why"] == (
        "measured because, judged by the fixed float32 bounds, torch: the runs parted at step "
        f"{step} after a step 0 "
        "that agreed in everything (training grows rounding as it grows a port error)"
    )
    assert {p.name for p in (out / FLOOR_DIR).iterdir()} == {"jax", "torch"}
    assert parity["loss"]["judged_by"] == "noise-floor"

"""What a verdict could have seen (compare/judge/sensitivity.py), and the float64 policy, in this
process: tensors and runs written as backends write them, perturbed just over and just under the
sensitivity the report states."""

import numpy as np
import pytest

from common.files.record import RunRecord, write_record
from common.files.tensor_file import write_tensors
from common.presets import load_spec
from common.vocab import BackendStatus
from compare.judge.parity import check_parity, compare_tensors
from compare.judge.sensitivity import sensitivity_line
from compare.judge.tolerances import load_policy, runtime_policy
from compare.reporting.render import markdown
from compare.reporting.report import ReportInputs, build_report
from compare.runs.orchestrate import BackendRun

RNG = np.random.default_rng(7)
REF = {
    "outputs": {"logits": RNG.standard_normal((4, 10)), "loss": np.asarray(2.3)},
    "grads": {"w": RNG.standard_normal((8, 8)) * 1e-2, "b": RNG.standard_normal(8) * 1e-3},
}


def moved(tensors: dict, group: str, name: str, relative: float) -> dict:
    """`tensors` with one tensor's largest element moved by `relative` of the tensor's largest
    magnitude."""
    out = {g: {n: np.array(v, copy=True) for n, v in t.items()} for g, t in tensors.items()}
    value = out[group][name]
    at = np.unravel_index(np.argmax(np.abs(value)), value.shape)
    value[at] += relative * np.max(np.abs(value))
    return out


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("key", ["outputs/logits", "grads/w", "grads/b"])
def test_a_change_just_over_the_stated_sensitivity_fails_and_just_under_passes(dtype, key):
    """Each tensor's sensitivity is (atol + rtol max|ref|) / max|ref|: the float32 logits' 1e-4 +
    1e-5 / 3.2, float64's 1e-9 + 1e-13 / 3.2. A relative change 1 % over it fails the tensor, 1 %
    under passes."""
    policy = load_policy("default", dtype)
    group, _, name = key.partition("/")
    bounds = policy["forward" if group == "outputs" else "grad"]
    scale = float(np.max(np.abs(REF[group][name])))
    stated = compare_tensors(REF, REF, policy)[key]["sensitivity"]
    assert stated == pytest.approx((bounds["atol"] + bounds["rtol"] * scale) / scale, rel=1e-12)
    assert (
        compare_tensors(REF, moved(REF, group, name, 1.01 * stated), policy)[key]["within"] is False
    )
    assert (
        compare_tensors(REF, moved(REF, group, name, 0.99 * stated), policy)[key]["within"] is True
    )


def record(backend: str, dtype: str, losses: list[float]) -> RunRecord:
    made = RunRecord(
        backend=backend,
        spec=load_spec("mlp-tiny", ["train.steps=3", f"train.dtype={dtype}"]).to_dict(),
        numerics={"dtype": dtype, "matmul_precision": "highest"},
        run_id="in-process",
    )
    for step, loss in enumerate(losses):
        made.add_step(step, loss, 1.0)
    return made


def test_a_groups_sensitivity_is_what_every_tensor_catches_the_losss_its_least_step():
    policy = load_policy("default", "float64")
    losses = [2.3, 2.2, 0.5]
    parity = check_parity(
        record("jax", "float64", losses), record("torch", "float64", losses), REF, REF, policy, []
    )
    found = parity["sensitivity"]
    rows = parity["tensors"]
    assert found["grads"]["every"] == max(
        rows["grads/w"]["sensitivity"], rows["grads/b"]["sensitivity"]
    )
    assert found["grads"]["median"] == pytest.approx(
        np.median([rows["grads/w"]["sensitivity"], rows["grads/b"]["sensitivity"]])
    )
    loss_bounds = policy["loss"]
    # the smallest loss: the least sensitive
    worst_step = (loss_bounds["atol"] + loss_bounds["rtol"] * 0.5) / 0.5
    assert found["loss"]["every"] == pytest.approx(
        max(worst_step, rows["outputs/loss"]["sensitivity"])
    )
    # float64 resolves ~1e-9
    assert found["logits"]["every"] == rows["outputs/logits"]["sensitivity"] < 2e-9
    line = sensitivity_line(parity, "float64")
    assert line.startswith(
        f"would have caught a relative change of {found['logits']['every']:.0e} in logits"
    )
    assert "--dtype float64" not in line  # a float64 run is the proof already
    float32 = check_parity(
        record("jax", "float32", losses),
        record("torch", "float32", losses),
        REF,
        REF,
        load_policy("default", "float32"),
        [],
    )
    assert float32["sensitivity"]["logits"]["every"] > 1e4 * found["logits"]["every"]
    assert (
        "a float64 run (--dtype float64; on the host where the device has no float64) resolves "
        "about 1e-09" in sensitivity_line(float32, "float32")
    )


def test_float64_judges_no_tighter_than_its_runtimes_own_rounding_and_says_so():
    """torch_xla 2.9's GELU rounds its constants to float32 (its registry row's float64_rtol): a
    pair with it is judged by those rtols in float64. Eager torch and torchax keep BatchNorm's
    running variance unbiased, Flax and torch_xla biased: such a pair's running statistics and eval
    forward get float32's after-training bounds. A float64 pair of one convention without torch_xla
    is judged by the policy as it is."""
    policy = load_policy("default", "float64")
    assert runtime_policy(policy, ("torch", "torchax"), has_state=True) == (policy, {})
    widened, why = runtime_policy(policy, ("jax", "torch_xla"), has_state=True)
    assert (
        widened["grad"]["rtol"] == 3e-8
        and widened["params"]["rtol"] == 1e-4
        and widened["grad"]["atol"] == 1e-14
    )
    assert (
        "state" not in widened
        and list(why) == ["torch_xla"]
        and "GELU with constants rounded to float32" in why["torch_xla"]
    )
    assert policy["grad"]["rtol"] == 1e-9  # the policy itself untouched
    # no running statistics: nothing to excuse
    assert runtime_policy(policy, ("jax", "torch")) == (policy, {})
    widened, why = runtime_policy(policy, ("jax", "torch"), has_state=True)
    assert widened["state"] == {"atol": 5e-3, "rtol": 1e-2}
    assert widened["grad"] == policy["grad"] and "unbiased on torch" in why["running statistics"]
    ref = {"state": {"bn.var": np.full(4, 1.0)}, "eval": {"logits": np.full(3, 2.0)}}
    other = {
        "state": {"bn.var": np.full(4, 1.0 + 1 / 127)},
        "eval": {"logits": np.full(3, 2.0 + 1e-3)},
    }
    assert not compare_tensors(ref, other, policy)["state/bn.var"]["within"]
    assert all(row["within"] for row in compare_tensors(ref, other, widened).values())


def test_the_report_states_each_backends_sensitivity_under_the_verdict(tmp_path):
    spec = load_spec("mlp-tiny", ["train.steps=3", "train.dtype=float64"])
    runs = {}
    for name in ("jax", "torch"):
        rec = record(name, "float64", [2.3, 2.2, 2.1])
        (tmp_path / name).mkdir()
        rec.tensors = write_tensors(tmp_path / name, REF)
        write_record(tmp_path / name, rec)
        runs[name] = BackendRun(
            name, tmp_path / name, BackendStatus.OK, 0, "", 1.0, ["python", "-m", name]
        )
    report = build_report(
        ReportInputs(
            spec, load_policy("default", "float64"), ["jax", "torch"], "jax", tmp_path, "in-process"
        ),
        runs,
        False,
    )
    assert report["verdict"] == "pass", report["message"]
    # kept per tensor
    assert report["parity"]["torch"]["tensors"]["outputs/logits"]["sensitivity"] < 2e-9
    md = markdown(report).splitlines()
    at = md.index("**Verdict: pass** (status `ok`, exit code 0)")
    assert md[at + 2].startswith("- torch: would have caught a relative change of 1e-09 in logits")

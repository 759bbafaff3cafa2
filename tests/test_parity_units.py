"""The parity arithmetic of `compare`, on hand-made records and tensors (no framework needed)."""

import json

import numpy as np
import pytest

from common.files.record import RunRecord, StepRecord
from common.presets import load_spec
from compare.judge import distribution, parity
from compare.judge.tensor_error import passes_with_words, tensor_error
from compare.judge.tolerances import ToleranceError, load_policy


def _record(backend, losses, overrides=(), dtype="float32"):
    spec = load_spec("gpt-tiny", list(overrides))
    return RunRecord(
        backend=backend,
        spec=spec.to_dict(),
        numerics={"dtype": dtype, "matmul_precision": "highest"},
        steps=[StepRecord(i, v, 1.0) for i, v in enumerate(losses)],
    )


def test_setting_differences_name_the_field():
    a, b = _record("jax", [1.0]), _record("torch_xla", [1.0], ["model.layernorm_eps=1e-6"])
    assert parity.setting_differences(a, b) == ["model.layernorm_eps: jax=1e-05 torch_xla=1e-06"]
    c = _record("torch_xla", [1.0])
    c.numerics["matmul_precision"] = "default"
    assert parity.setting_differences(a, c) == [
        "numerics.matmul_precision: jax='highest' torch_xla='default'"
    ]
    assert parity.setting_differences(a, _record("torch_xla", [2.0])) == []


def test_first_divergent_step_uses_atol_plus_rtol():
    bounds = {"atol": 1e-4, "rtol": 1e-3}  # at loss 2.0 the bound is 2.1e-3
    result = parity.compare_losses([2.0, 2.0, 2.0, 2.0], [2.0, 2.002, 2.0025, 2.0], bounds)
    assert result["first_divergent_step"] == 2
    assert result["per_step_abs"] == pytest.approx([0.0, 0.002, 0.0025, 0.0])
    assert result["max_abs"] == pytest.approx(0.0025)
    # NaN on one side
    assert parity.compare_losses([1.0, None], [1.0, 1.0], bounds)["first_divergent_step"] == 1
    # stopped early
    assert parity.compare_losses([1.0, 1.0, 1.0], [1.0, 1.0], bounds)["first_divergent_step"] == 2


def test_tensor_errors_and_worst_ranking():
    policy = load_policy("default", "float32")
    ref = {
        "grads": {"w": np.array([1.0, -2.0]), "k_bias": np.array([1e-12, 0.0])},
        "outputs": {},
        "params": {},
    }
    other = {
        "grads": {"w": np.array([1.0, -2.003]), "k_bias": np.array([3e-12, 0.0])},
        "outputs": {},
        "params": {},
    }
    errors = parity.compare_tensors(ref, other, policy)
    w = errors["grads/w"]
    assert w["abs"] == pytest.approx(3e-3) and w["rel"] == pytest.approx(1.5e-3)
    assert w["within"] is False  # bound: atol 1e-6 + rtol 1e-3 * max|ref| 2 = 2.001e-3 < 3e-3
    assert w["tolerance_used"] == pytest.approx(3e-3 / 2.001e-3)
    assert errors["grads/k_bias"]["rel"] == pytest.approx(2.0) and errors["grads/k_bias"]["within"]
    worst = parity.worst_tensors(errors)
    # by share of tolerance, not by rel
    assert [t["name"] for t in worst] == ["grads/w", "grads/k_bias"]
    shapes = tensor_error(np.zeros(3), np.zeros(4), 1e-6, 1e-6)
    assert shapes["within"] is False and "shapes differ" in shapes["note"]


def test_tolerance_profiles_and_files(tmp_path):
    assert load_policy("default", "bfloat16")["loss"] == {"atol": 5e-2, "rtol": 2e-2}
    custom = tmp_path / "tol.json"
    custom.write_text(json.dumps({"float32": {"loss": {"atol": 0.5}}}))
    policy = load_policy(str(custom), "float32")
    assert policy["loss"] == {"atol": 0.5, "rtol": 5e-4} and policy["grad"]["atol"] == 1e-6
    custom.write_text(json.dumps({"float32": {"weights": {"atol": 1}}}))
    with pytest.raises(
        ToleranceError, match="float32.weights must be one of forward, grad, loss, params"
    ):
        load_policy(str(custom), "float32")
    with pytest.raises(ToleranceError, match="not a profile"):
        load_policy(str(tmp_path / "missing.json"), "float32")


def test_logit_agreement_by_hand():
    ref = np.log(np.array([[[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]]]))
    other = np.log(np.array([[[0.25, 0.5, 0.25], [0.1, 0.2, 0.7]]]))
    a = distribution.logit_agreement(ref, other)
    # position 0; position 1 is identical
    kl0 = 0.5 * np.log(0.5 / 0.25) + 0.25 * np.log(0.25 / 0.5)
    assert a["kl_mean"] == pytest.approx(kl0 / 2) and a["kl_max"] == pytest.approx(kl0)
    assert a["top1"] == 0.5 and a["top3"] == 1.0 and a["positions"] == 2
    assert distribution.logit_agreement(ref, ref)["kl_max"] == pytest.approx(0.0, abs=1e-15)
    # agreeing but for rounding: never a negative KL
    rows = np.random.default_rng(0).standard_normal((64, 50))
    # -2.3e-17 before rows were clamped at 0
    shifted = distribution.logit_agreement(rows, rows + 1.0)
    assert shifted["kl_mean"] >= 0 and shifted["kl_max"] == pytest.approx(0.0, abs=1e-12)
    assert distribution.logit_agreement(ref, other[..., :2]) is None


def test_bfloat16_logits_are_judged_by_distribution():
    logits = np.random.default_rng(0).standard_normal((4, 8, 32))
    shifted = logits + 0.3  # the same distributions: softmax ignores a constant shift
    ref, other = {"outputs": {"logits": logits}}, {"outputs": {"logits": shifted}}
    for dtype, within in (("float32", False), ("bfloat16", True)):
        policy = load_policy("default", dtype)
        tensors = parity.compare_tensors(ref, other, policy)
        d = distribution.judge_distribution(ref, other, policy["distribution"], dtype, tensors)
        assert d["kl_max"] < 1e-12 and d["top1"] == 1.0 and d["within"]
        # max abs 0.3 fails fp32's bound either way
        assert tensors["outputs/logits"]["within"] is within


def test_distribution_bounds_from_a_tolerance_file(tmp_path):
    custom = tmp_path / "tol.json"
    custom.write_text(json.dumps({"bfloat16": {"distribution": {"kl_mean": 1e-5}}}))
    assert load_policy(str(custom), "bfloat16")["distribution"] == {"kl_mean": 1e-5, "top1": 0.9}
    custom.write_text(json.dumps({"bfloat16": {"distribution": {"kl": 1}}}))
    with pytest.raises(ToleranceError, match="or distribution with kl_mean/top1"):
        load_policy(str(custom), "bfloat16")


def test_a_failing_tensor_says_the_smallest_tolerance_that_would_pass_it():
    """Each suggestion, typed back as the tolerance, passes; a hair less fails (the rule is
    max|a-b| <= atol + rtol*max|ref|)."""
    ref = np.linspace(-2.0, 2.0, 1000)
    other = ref.copy()
    other[[10, 500, 990]] += [3e-3, -2e-3, 1e-3]  # three elements off, the rest equal
    atol, rtol = 1e-6, 1e-4  # bound 2.01e-4: all three over
    error = tensor_error(ref, other, atol, rtol)
    assert not error["within"] and error["over"] == 3 and error["elements"] == 1000
    found = error["passes_with"]
    # the largest error 3e-3 at max|ref| 2: atol 3e-3 - 1e-4 * 2, rtol (3e-3 - 1e-6) / 2 =
    # 1.4995e-3, 3 of 1000
    assert found == {
        "atol": pytest.approx(2.8e-3),
        "rtol": pytest.approx(1.5e-3),
        "fraction": pytest.approx(3e-3),
    }
    assert tensor_error(ref, other, found["atol"], rtol)["within"]
    assert tensor_error(ref, other, atol, found["rtol"])["within"]
    assert tensor_error(ref, other, atol, rtol, fraction=found["fraction"])["within"]
    assert not tensor_error(ref, other, 0.99 * (3e-3 - rtol * 2), rtol)["within"]
    assert not tensor_error(ref, other, atol, 0.99 * (3e-3 - atol) / 2)["within"]
    # floor(2.9): 2 allowed
    assert not tensor_error(ref, other, atol, rtol, fraction=0.0029)["within"]
    assert passes_with_words(found) == (
        "would pass with atol 0.0028, rtol 0.0015 or 0.3% of elements over (each alone)"
    )


def test_a_fraction_lets_that_many_elements_over_and_the_bound_then_covers_the_rest():
    ref = np.ones(200)
    other = ref + np.r_[np.full(4, 1e-2), np.full(196, 1e-7)]  # four elements far off
    error = tensor_error(ref, other, 1e-5, 1e-4, fraction=0.02)  # 4 of 200 allowed
    assert error["within"] and error["over"] == 4 and error["abs"] == pytest.approx(1e-2)
    # the 5th largest error
    assert error["tolerance_used"] == pytest.approx(1e-7 / (1e-5 + 1e-4), rel=1e-6)
    # 3 allowed: the 4th must be covered
    error = tensor_error(ref, other, 1e-5, 1e-4, fraction=0.015)
    assert not error["within"] and error["tolerance_used"] == pytest.approx(1e-2 / 1.1e-4, rel=1e-6)
    assert error["passes_with"]["fraction"] == pytest.approx(0.02)
    # 1e-2 - 1e-4 * 1, rounded up to two digits
    assert error["passes_with"]["atol"] == pytest.approx(0.01)
    zeros = tensor_error(np.zeros(4), np.full(4, 1e-3), 1e-6, 1e-3)  # max|ref| 0: no rtol can help
    assert zeros["passes_with"]["rtol"] is None and zeros["passes_with"]["atol"] == pytest.approx(
        1e-3
    )
    assert passes_with_words(zeros["passes_with"]) == (
        "would pass with atol 0.001 or 100% of elements over (each alone)"
    )


@pytest.mark.error_case("tolerance-file-shape", "tolerance-file-value")
def test_a_tolerance_file_may_allow_a_fraction_of_tensor_elements(tmp_path):
    custom = tmp_path / "tol.json"
    custom.write_text(json.dumps({"float32": {"grad": {"fraction": 0.001}}}))
    policy = load_policy(str(custom), "float32")
    assert policy["grad"] == {"atol": 1e-6, "rtol": 1e-3, "fraction": 0.001}
    assert policy["forward"]["fraction"] == 0.0 and "fraction" not in policy["loss"]
    custom.write_text(json.dumps({"float32": {"loss": {"fraction": 0.1}}}))
    with pytest.raises(
        ToleranceError, match="float32.loss.fraction: the loss is judged step by step"
    ):
        load_policy(str(custom), "float32")
    custom.write_text(json.dumps({"float32": {"params": {"fraction": 1.5}}}))
    with pytest.raises(
        ToleranceError, match=r"float32.params.fraction=1.5 must be a share from 0 to 1"
    ):
        load_policy(str(custom), "float32")
    ref = {"grads": {"w": np.zeros(1000)}}
    other = {"grads": {"w": np.r_[1.0, np.zeros(999)]}}  # one element in a thousand off
    assert parity.compare_tensors(ref, other, policy)["grads/w"]["within"]
    assert not parity.compare_tensors(ref, other, load_policy("default", "float32"))["grads/w"][
        "within"
    ]


def test_a_parameter_gradients_do_not_reach_is_shown_not_judged_by_its_final_value():
    """A key bias: its gradient is rounding noise on both sides, so Adam random-walks its value; its
    final value is not judged (compare/judge/unreached.py), while a reached parameter with the same
    final difference fails, and a parameter one side leaves unreached but the other reaches is
    judged by its gradient."""
    policy = load_policy("default", "bfloat16")  # params: 2e-2 + 2e-2 * max|ref|
    rng = np.random.default_rng(0)
    # median max|g| ~2e-2
    grads = {f"layer{i}.kernel": rng.standard_normal((4, 4)) * 1e-2 for i in range(5)}
    ref_g = {**grads, "attn.k.bias": np.full(4, 3e-8), "attn.v.bias": np.full(4, 1e-2)}
    other_g = {**grads, "attn.k.bias": np.full(4, -2e-8), "attn.v.bias": np.full(4, 1e-2)}
    final = {name: np.zeros_like(g) for name, g in ref_g.items()}
    walked = {**final, "attn.k.bias": np.full(4, 0.1)}  # 0.1 apart: 5x the bound
    a, b = (
        _record("jax", [2.0, 1.9], dtype="bfloat16"),
        _record("torch", [2.0, 1.9], dtype="bfloat16"),
    )
    verdict = parity.check_parity(
        a, b, {"grads": ref_g, "params": final}, {"grads": other_g, "params": walked}, policy, []
    )
    threshold = 0.25 * 2**-7 * float(np.median([np.abs(g).max() for g in ref_g.values()]))
    assert verdict["passed"] and verdict["unreached"] == {
        "attn.k.bias": {
            "reference": pytest.approx(3e-8),
            "other": pytest.approx(2e-8),
            "threshold": pytest.approx(threshold),
        }
    }
    row = verdict["tensors"]["params/attn.k.bias"]
    assert row["judged"] is False and row["within"] and row["abs"] == pytest.approx(0.1)
    assert row["note"].startswith(
        "not judged by its final value: its step-0 gradient is rounding noise"
    )
    assert "params/attn.k.bias" not in [w["name"] for w in verdict["worst"]]
    # the same difference on a parameter the loss reaches
    reached = {**final, "attn.v.bias": np.full(4, 0.1)}
    verdict = parity.check_parity(
        a, b, {"grads": ref_g, "params": final}, {"grads": other_g, "params": reached}, policy, []
    )
    assert not verdict["passed"] and verdict["worst"][0]["name"] == "params/attn.v.bias"
    # a port that drops the value bias: its gradient is 0
    one_side = {**other_g, "attn.v.bias": np.zeros(4)}
    verdict = parity.check_parity(
        a, b, {"grads": ref_g, "params": final}, {"grads": one_side, "params": final}, policy, []
    )
    assert (
        "attn.v.bias" not in verdict["unreached"]
        and not verdict["tensors"]["grads/attn.v.bias"]["within"]
    )


def test_other_outputs_are_compared_by_name_and_one_of_another_layout_is_shown_only():
    policy = load_policy("default", "float32")
    logits, features = np.ones((2, 5)), np.arange(24.0).reshape(2, 3, 2, 2)
    ref = {
        "outputs": {
            "logits": logits,
            "loss": np.asarray(1.0),
            "features": features,
            "hidden": np.ones(4),
            "only_here": np.ones(2),
        }
    }
    other = {
        "outputs": {
            "logits": logits,
            "loss": np.asarray(1.0),
            "features": features.transpose(0, 2, 3, 1),
            "hidden": np.ones(4) + 0.1,
        }
    }
    errors = parity.compare_tensors(ref, other, policy)
    # both sides'
    assert set(errors) == {"outputs/logits", "outputs/loss", "outputs/features", "outputs/hidden"}
    assert errors["outputs/hidden"]["within"] is False and errors["outputs/hidden"][
        "abs"
    ] == pytest.approx(0.1)
    shown = errors["outputs/features"]
    assert (
        shown["within"]
        and shown["judged"] is False
        and "[2, 3, 2, 2] vs [2, 2, 2, 3]" in shown["note"]
    )
    assert [t["name"] for t in parity.worst_tensors(errors)][0] == "outputs/hidden"


def test_a_module_differing_only_in_shape_never_stands_before_one_differing_in_its_numbers():
    """HF's vision tower returns a ModelOutput (hidden states [2, 17, 8], pooled [2, 8]) where the
    port returns the pooled one: a shape-only difference, listed, while the module whose numbers
    differ is named."""
    rng = np.random.default_rng(0)
    x, h = (
        rng.standard_normal((2, 8)).astype(np.float32),
        rng.standard_normal((2, 8)).astype(np.float32),
    )
    ref = {
        "vision:in": x,
        "vision": rng.standard_normal((2, 17, 8)).astype(np.float32),
        "text:in": x,
        "text": h,
        "head:in": h,
        "head": np.tanh(h),
    }
    other = {
        **ref,
        "vision": rng.standard_normal((2, 8)).astype(np.float32),
        "text": h * 1.5,
        "head:in": h * 1.5,
        "head": np.tanh(h * 1.5),
    }
    found = parity.first_divergent_module(ref, other, {"atol": 1e-5, "rtol": 1e-4})
    assert (found["module"], found["input_agrees"], found["shapes_differ"]) == (
        "text",
        True,
        ["vision"],
    )
    assert found["modules_diverging"] == 3
    # with no module differing in its numbers, the shape-only one is the location, said as such
    alone = parity.first_divergent_module(
        ref, {**ref, "vision": other["vision"]}, {"atol": 1e-5, "rtol": 1e-4}
    )
    assert alone["module"] == "vision" and alone["output_error"]["note"].startswith(
        "output shapes differ"
    )


def test_a_one_sided_set_of_a_twins_hyperparameter_is_an_intended_difference():
    """--jax-set model.rope_theta=... on a twin is recorded as model.hparams.rope_theta: judged as a
    preset's one-sided set is (it read not_comparable)."""
    a, b = _record("jax", [2.0, 1.9]), _record("torch", [2.0, 1.9])
    a.spec["model"]["hparams"], b.spec["model"]["hparams"] = (
        {"rope_theta": 10000.0},
        {"rope_theta": 500000.0},
    )
    policy = load_policy("default", "float32")
    judged = parity.check_parity(a, b, {}, {}, policy, ["model.rope_theta"])
    assert judged["comparable"] and judged["setting_differences"] == judged[
        "intended_differences"
    ] == ["model.hparams.rope_theta: jax=10000.0 torch=500000.0"]
    assert not parity.check_parity(a, b, {}, {}, policy, [])["comparable"]

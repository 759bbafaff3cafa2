"""A NaN loss gets the likely cause the toolkit can see (driver/nonfinite.py)."""

from common.presets import load_spec
from driver.nonfinite import input_problem, likely_cause


def test_a_climbing_loss_points_at_the_learning_rate():
    spec = load_spec("mlp-tiny", ["train.lr=0.5", "train.grad_clip=0"])
    assert likely_cause(spec, [2.3, 9.1, 80.0, None]) == (
        "the loss was diverging (2.3 at step 0 -> 80 at step 2): lower train.lr (now 0.5) and "
        "turn gradient "
        "clipping on (train.grad_clip=1.0)"
    )
    clipped = load_spec("mlp-tiny", ["train.lr=0.5"])
    assert likely_cause(clipped, [2.3, 9.1, None]).endswith("lower train.lr (now 0.5)")


def test_a_steady_bfloat16_loss_points_at_bfloat16_and_a_steady_float32_one_at_the_model():
    bf16 = load_spec("gpt-tiny", ["train.dtype=bfloat16"])
    assert "computes in bfloat16" in likely_cause(bf16, [5.5, 5.4, 5.3, None])
    fp32 = load_spec("gpt-tiny")
    assert likely_cause(fp32, [5.5, 5.4, None]).startswith("no cause the toolkit can see")
    assert likely_cause(fp32, [None]).startswith(
        "the very first loss is non-finite with finite inputs"
    )


def test_the_data_comes_first():
    spec = load_spec("mlp-tiny")
    assert input_problem(spec, 3) is None  # the built-in data is finite
    assert (
        likely_cause(spec, [2.3, 9.1, None], "the batch of step 2 holds NaN or Inf inputs: ...")
        == "the batch of step 2 holds NaN or Inf inputs: ..."
    )


def test_a_twins_own_loss_is_named_first_when_the_very_first_loss_is_not_finite():
    from common.presets import load_spec

    spec = load_spec("", [], twin="tests/data/batch_sources/twins.py:good")
    assert likely_cause(spec, [None]) == (
        "the very first loss is non-finite with finite inputs: the twin's own loss "
        "(torch='models.py:torch_loss', "
        "nnx='models.py:nnx_loss'), the model's forward (a log of 0, a division by 0) or its "
        "start weights"
    )

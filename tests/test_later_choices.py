"""Choices where two runs part after an agreeing step 0 (issue 45 item 1, later steps): both sides'
top-k, argmax and sort calls captured at that step, over its whole batch, from the weights each
side's own steps left (compare/runs/extra_runs.py choices_where_parted), set side by side
(compare/judge/decided.py judge_later_choices) and said in the report. They explain where the runs
part; the noise floor decides. The end-to-end run is in tests/test_example_mixtral.py."""

import numpy as np

from common.capture.decisions import Decision
from compare.judge.decided import LATER, judge_later_choices, later_words
from compare.judge.messages import failure_message
from compare.runs.extra_runs import _parted_later
from tests.test_decisions import BOUND, _topk


def _at(step: int, d: Decision) -> dict:
    return {
        LATER: {
            step: {
                "decisions": {"0.indices": d.indices, "0.scores": d.scores},
                "decisions_facts": [{"module": d.module, "op": d.op, "k": d.indices.shape[-1]}],
            }
        }
    }


def test_the_choices_at_the_parting_step_say_how_many_differ_where_and_against_the_scores_drift():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(16, 4)).astype(np.float32)
    # each side's steps apart
    drifted = scores + rng.normal(scale=1e-3, size=scores.shape).astype(np.float32)
    # one token's 2nd and 3rd experts swap
    scores[5], drifted[5] = [0.9, 0.5, 0.498, 0.1], [0.9, 0.498, 0.5, 0.1]
    parity = {}
    judge_later_choices(parity, _at(3, _topk(scores, 2)), _at(3, _topk(drifted, 2)), BOUND)
    found = parity["decisions_later"]
    assert found["step"] == 3 and found["flipped"] == 1 and found["first"]["rows"] == 16
    assert found["first"]["widest_margin"] <= found["first"]["scores_max_abs"]
    words = later_words(found)
    assert words.startswith(
        "at step 3, where the runs part, 1 choices differ over its whole batch (first at "
        "layers.0.moe, topk k=2: 1 of 16 rows"
    )
    assert (
        "; 0 of them within rounding of a tie (the forward bound), every one within how far the "
        "ranked scores had "
        "drifted apart by then (" in words
    )
    alike = {}
    judge_later_choices(alike, _at(3, _topk(scores, 2)), _at(3, _topk(scores, 2)), BOUND)
    assert later_words(alike["decisions_later"]).endswith(
        "chose alike over its whole batch: the runs part elsewhere"
    )
    none = {}  # no capture at a later step: nothing said
    judge_later_choices(none, {}, _at(3, _topk(scores, 2)), BOUND)
    assert none == {}


def test_the_message_of_a_pair_that_parts_later_says_its_choices_there():
    found = {
        "step": 2,
        "matched": True,
        "flipped": 0,
        "decisions": [{"module": "layers.0.moe", "flipped": 0}],
    }
    parity = {
        "worst": [],
        "first_divergent_step": 2,
        "tensors": {},
        "unmeasured_noise": "--fp32-tolerance noise-floor",
        "decisions": {
            "matched": True,
            "flipped": 0,
            "decisions": [{"module": "layers.0.moe", "flipped": 0}],
        },
    }
    assert failure_message("torch", parity).endswith(
        "the model makes 1 discrete choices (top-k, argmax, sort; first in layers.0.moe), all "
        "alike at step 0, and a "
        "tie flipped by rounding at a later step parts the runs by design: their choices at that "
        "step were not "
        "captured)"
    )
    said = failure_message("torch", {**parity, "decisions_later": found})
    assert said.endswith(
        "by design: at step 2, where the runs part, every one of 1 decisions chose alike over its "
        "whole batch: the runs part elsewhere)"
    )
    floored = failure_message(
        "torch", {**parity, "unmeasured_noise": None, "decisions_later": found}
    )
    assert (
        floored
        == "torch: parity failed: first divergent step 2, at step 2, where the runs part, every "
        "one of 1 "
        "decisions chose alike over its whole batch: the runs part elsewhere"
    )


def test_which_pairs_get_their_choices_captured_where_they_part():
    later = {"unmeasured_noise": "--fp32-tolerance noise-floor", "first_divergent_step": 4}
    assert _parted_later(later)  # step 0 not captured: whether the model chooses is not known yet
    assert _parted_later({**later, "decisions": {"matched": True, "flipped": 0}})
    # step 0 explains it
    assert not _parted_later({**later, "decisions": {"matched": True, "flipped": 3}})
    # captured, no choice
    assert not _parted_later({**later, "first_divergent_module": {"modules_compared": 12}})
    # a floor measured, or parted at step 0
    assert not _parted_later({**later, "unmeasured_noise": None})
    assert not _parted_later({**later, "first_divergent_step": 0})


def test_only_this_runs_captures_at_a_later_step_are_read(tmp_path):
    """A capture another compare run left in `<backend>/activations/at-step-<s>/` (another run id)
    is never read as this run's choices; this run's is, by the step its folder names."""
    from common.capture.decisions import to_tensors
    from common.files.record import RunRecord, write_record
    from common.files.tensor_file import write_tensors
    from common.presets import load_spec
    from compare.runs.capture_runs import later_choices

    scores = np.random.default_rng(1).normal(size=(6, 4)).astype(np.float32)
    for step, run_id in ((2, "this-run"), (5, "an-earlier-run")):
        folder = tmp_path / "activations" / f"at-step-{step}"
        folder.mkdir(parents=True)
        record = RunRecord(backend="jax", spec=load_spec("mlp-tiny").to_dict(), run_id=run_id)
        arrays, record.extra.decisions = to_tensors([_topk(scores, 2)])
        record.extra.capture_step = step
        record.tensors = write_tensors(folder, {"decisions": arrays})
        write_record(folder, record)
    found = later_choices(tmp_path, "this-run")
    assert list(found) == [2] and found[2]["decisions_facts"] == [
        {"module": "layers.0.moe", "op": "topk", "k": 2}
    ]
    assert later_choices(tmp_path, "another-run") == {}

"""Which output is the logits (common/twin/outputs.py), on the shapes forwards return."""

import numpy as np
import pytest

from common.twin.outputs import choose, logits_of

LOGITS = np.zeros((2, 3), np.float32)


class ModelOutputLike(dict):  # a Hugging Face ModelOutput is a dict with attributes
    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


@pytest.mark.parametrize(
    "out, which",
    [
        (LOGITS, None),
        (LOGITS, "scores"),
        ((LOGITS, "hidden"), None),
        ([LOGITS], None),
        ({"logits": LOGITS}, None),
        (ModelOutputLike(loss=np.float32(1.0), logits=LOGITS), None),
        ({"scores": LOGITS}, "scores"),
        ((np.int64(3), LOGITS), 1),
        ((None, LOGITS), -1),
    ],
)
def test_the_logits_are_found(out, which):
    assert choose(out, which) is LOGITS


@pytest.mark.parametrize(
    "out, which, message",
    [
        (
            (3, LOGITS),
            None,
            "returns a tuple with no array as itself, as its 'logits' or as its first element",
        ),
        ({"scores": LOGITS}, None, r"returns a dict \(entries: scores\) with no array"),
        ((LOGITS,), 2, "returns a tuple whose output 2 is not an array"),
        ("text", None, "returns a str with no array"),
    ],
)
def test_outputs_without_logits_are_refused_with_the_fix(out, which, message):
    assert choose(out, which) is None
    with pytest.raises(TypeError, match=message):
        logits_of(out, which)

"""A twin's start state (common/twin/start_state.py, compare/judge/start_state.py): the buffers and
non-parameter Variables each side's factory builds are linked by name, as parameters are, and
compared before anything trains; a rotary table built with another base fails at that buffer, a
correct one passes, what one side holds alone is listed as not compared."""

import json

import numpy as np
import pytest

from common.twin.start_state import NNX_STATE, STATE_LINKS, TORCH_STATE, link_state, storable
from common.vocab import ReportStatus
from common.weights import save_checkpoint
from compare.judge.start_state import start_state_check
from tests.helpers import run_cli

LLAMA = "examples/llama/twin.py"


def test_buffers_are_linked_by_name_through_the_twins_renames_and_the_rest_listed():
    linked = link_state(
        [
            "model.layers.0.self_attn.inv_freq",
            "model.rotary_emb.original_inv_freq",
            "embeddings.position_ids",
        ],
        ["layers.layers.0.attn.inv_freq", "ema.decay"],
        {r"^model\.": "", r"\.self_attn\.": ".attn."},
    )
    assert linked == {
        "links": {"model.layers.0.self_attn.inv_freq": "layers.layers.0.attn.inv_freq"},
        "torch_only": ["model.rotary_emb.original_inv_freq", "embeddings.position_ids"],
        "nnx_only": ["ema.decay"],
    }


def test_a_state_value_is_kept_as_numbers_16_bit_floats_widened():
    import ml_dtypes

    half = storable(np.array([1.5, -2.0], ml_dtypes.bfloat16))
    assert half.dtype == np.float32 and half.tolist() == [1.5, -2.0]
    assert storable(np.arange(3)).dtype == np.int64 and storable(np.array([True])).dtype == bool
    assert storable(np.array([object()])) is None and storable(np.array([1j])) is None


def _start(tmp_path, torch_state: dict, nnx_state: dict, links: dict):
    save_checkpoint(tmp_path / TORCH_STATE, torch_state)
    save_checkpoint(tmp_path / NNX_STATE, nnx_state)
    (tmp_path / STATE_LINKS).write_text(
        json.dumps({"links": links, "torch_only": ["extra"], "nnx_only": []})
    )
    return start_state_check(tmp_path, "default")


def test_a_table_within_rounding_agrees_and_one_of_another_base_differs_by_name(tmp_path):
    hd = np.arange(0, 16, 2, dtype=np.float64) / 16
    table = (1.0 / 10000.0**hd).astype(np.float32)
    one_ulp = np.nextafter(table, np.float32(1))  # another framework's pow, rounded the other way
    ok = _start(
        tmp_path,
        {"a.inv_freq": table, "ids": np.arange(4)},
        {"a.inv_freq": one_ulp, "ids": np.arange(4)},
        {"a.inv_freq": "a.inv_freq", "ids": "ids"},
    )
    assert (
        ok.status == ReportStatus.OK and ok.section["compared"] == 2 and ok.section["differ"] == []
    )
    assert ok.section["torch_only"] == ["extra"]
    other = (1.0 / 500000.0**hd).astype(np.float32)
    failed = _start(
        tmp_path,
        {"a.inv_freq": table, "ids": np.arange(4)},
        {"b.inv_freq": other, "ids": np.arange(4)},
        {"a.inv_freq": "b.inv_freq", "ids": "ids"},
    )
    assert failed.status == ReportStatus.PARITY_FAILED
    assert [(d["torch"], d["nnx"]) for d in failed.section["differ"]] == [
        ("a.inv_freq", "b.inv_freq")
    ]
    assert (
        "`b.inv_freq` (torch `a.inv_freq`)" in failed.message and "7 of 8 values" in failed.message
    )


def test_integers_are_compared_exactly_and_a_shape_that_differs_differs(tmp_path):
    found = _start(
        tmp_path,
        {"ids": np.arange(4), "mask": np.ones(3, bool)},
        {"ids": np.array([0, 1, 2, 4]), "mask": np.ones(4, bool)},
        {"ids": "ids", "mask": "mask"},
    )
    assert found.status == ReportStatus.PARITY_FAILED
    assert [d["why"] for d in found.section["differ"]] == [
        "1 of 4 values differ (compared exactly)",
        "shape [3] on the torch side, [4] on the NNX side",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("twin, code", [("llama_table", 0), ("llama_table_misported", 1)])
def test_a_rotary_table_held_in_a_buffer_is_compared_and_another_base_fails_at_it(
    tmp_path, twin, code
):
    """torch_llama.py holds each attention's `inv_freq` in a buffer; the NNX port holds it in a
    Buffer Variable (`layers.N.attn.inv_freq`, met through the twin's rename); the mis-port builds
    it with Llama 3's base."""
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(tmp_path / "run"),
        "--twin",
        f"{LLAMA}:{twin}",
        "--backend",
        "jax,torch",
        "--steps",
        "2",
        timeout=600,
    )
    assert proc.returncode == code, proc.stderr[-2000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    state = report["start_state"]
    assert state["links"] == {
        f"layers.{i}.self_attn.inv_freq": f"layers.{i}.attn.inv_freq" for i in (0, 1)
    }
    assert state["torch_only"] == state["nnx_only"] == []
    markdown = (tmp_path / "run" / "report.md").read_text()
    if code == 0:
        assert state["differ"] == [] and "Start state: 2 compared, 0 differ" in markdown
        return
    assert [d["nnx"] for d in state["differ"]] == [
        "layers.0.attn.inv_freq",
        "layers.1.attn.inv_freq",
    ]
    assert report["status"] == "parity_failed"
    assert (
        "the start state differs at `layers.0.attn.inv_freq` (torch `layers.0.self_attn.inv_freq`)"
        in report["message"]
    )
    assert "| layers.0.attn.inv_freq | layers.0.self_attn.inv_freq | differs:" in markdown

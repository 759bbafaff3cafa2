"""Summaries in a float64 run are reduced, kept and judged in float64: a correct pair passes with
`--tensors summary` (the statistics once reduced in float32 on the devices left float64's bounds),
and `--tensors auto`'s second pass reproduces its run (no "did not reproduce" from comparing two
precisions) while a deliberate 1e-7 difference still fails where it was made."""

import pytest

from tests.test_examples import compare


@pytest.mark.slow
def test_a_correct_float64_pair_passes_on_summaries(tmp_path):
    proc, report = compare(
        tmp_path / "run",
        "--backend",
        "jax,torch",
        "--spec",
        "gpt-tiny",
        "--steps",
        "3",
        "--dtype",
        "float64",
        "--tensors",
        "summary",
    )
    assert proc.returncode == 0, report["message"]
    rows = report["parity"]["torch"]["tensors"]
    summarized = [k for k, row in rows.items() if row.get("judged_by") == "summary"]
    assert len(summarized) >= 10 and all(rows[k]["within"] for k in summarized), summarized


@pytest.mark.slow
def test_a_float64_second_pass_reproduces_its_run_and_a_small_difference_still_fails(tmp_path):
    proc, report = compare(
        tmp_path / "run",
        "--backend",
        "jax,torch",
        "--spec",
        "gpt-tiny",
        "--steps",
        "3",
        "--dtype",
        "float64",
        "--tensors",
        "auto",
        "--torch-set",
        "train.start_scale=blocks.1.mlp.fc.kernel*1.0000001",
    )
    assert proc.returncode == 1, report["message"]
    passes = report["tensors"]["second_pass"]
    assert set(passes) == {"jax", "torch"}, passes
    for name, second in passes.items():
        assert second["whole"] and second["not_reproduced"] == {}, (name, second)
    found = report["parity"]["torch"]["first_divergent_module"]
    assert found["module"] == "blocks.1.mlp.fc", found

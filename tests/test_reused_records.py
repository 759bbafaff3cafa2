"""A reused record (`--<backend>-record`) is judged as it ran: a run that asks other training
settings (another dtype, whose bounds would judge it, or more steps than it holds) is refused before
anything is written."""

from __future__ import annotations

import hashlib

import pytest

from tests.test_reliability import compare, one_line_error


def digests(folder) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.error_case("record-ran-otherwise")
@pytest.mark.parametrize(
    "flags, said",
    [
        (["--steps", "7"], "train.steps=3, this run's is 7"),
        (
            ["--steps", "3", "--dtype", "bfloat16"],
            "train.dtype='float32', this run's is 'bfloat16'",
        ),
        # another model than the record ran: judged as if it were that one
        (
            ["--steps", "3", "--set", "model.activation=tanh"],
            "model.activation='relu', this run's is 'tanh'",
        ),
    ],
)
def test_a_record_is_never_judged_under_settings_it_did_not_run_with(
    finished_run, tmp_path, flags, said
):
    before = digests(finished_run)
    proc = compare(
        "--out",
        str(tmp_path / "again"),
        "--backend",
        "jax",
        "--spec",
        "mlp-tiny",
        *flags,
        "--jax-record",
        str(finished_run / "jax"),
    )
    assert proc.returncode == 2, proc.stderr
    assert one_line_error(proc) == (
        f"error: --jax-record {finished_run / 'jax'} ran with {said}; a reused run is judged as "
        "it ran: pass the "
        "flags it ran with (its spec.json) or run jax here instead"
    )
    assert not (tmp_path / "again").exists()
    assert digests(finished_run) == before

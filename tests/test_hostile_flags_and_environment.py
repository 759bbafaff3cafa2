"""The flags, environment variables and cached files a run reads, held to the error promise: a bad
value is one `error:` line naming it and exit 2 before anything runs (no run directory, no
traceback), whether compare or a backend alone reads it; a cache file that is not a file never
hangs a run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, process_env, run_cli
from tests.test_hostile_values import one_error


def refused(module: str, tmp_path: Path, *args: str, env: dict | None = None) -> str:
    out = tmp_path / "run"
    proc = run_cli(module, *args, "--out", str(out), env=env, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert not out.exists(), list(out.iterdir())
    return one_error(proc)


@pytest.mark.error_case("env-bad")
@pytest.mark.parametrize("value", ["abc", "nan", "1e400", "-5", "0"])
def test_a_bad_coordinator_wait_is_refused_by_compare_in_one_line(tmp_path, value):
    line = refused(
        "compare",
        tmp_path,
        "--backend",
        "jax",
        "--spec",
        "mlp-tiny",
        env={"XLA_TWINS_COORDINATOR_WAIT_S": value},
    )
    assert line == (
        f"error: XLA_TWINS_COORDINATOR_WAIT_S={value!r} is not a number of seconds over 0 and "
        "at most 86400; set one, or unset it for the default 300 s"
    )


def test_a_bad_coordinator_wait_breaks_no_import():
    """Read when used, never at import: the modules that use it import under any value."""
    proc = subprocess.run(
        [sys.executable, "-c", "import compare.runs.meeting, compare.__main__, jax_impl.sharding"],
        cwd=REPO,
        env={**process_env(), "XLA_TWINS_COORDINATOR_WAIT_S": "abc"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.error_case("flag-out-of-range")
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--steps", "0"), "argument --steps: '0' is not a whole number of steps from 1 to"),
        (("--seed", "-1"), "argument --seed: '-1' is not a whole number from 0 to 4294967295"),
        (("--coordinator", "127.0.0.1:80"), "port 80 is not one to count up from"),
    ],
)
def test_an_integer_flag_out_of_its_range_is_refused_by_compare(tmp_path, flags, message):
    line = refused("compare", tmp_path, "--backend", "jax", "--spec", "mlp-tiny", *flags)
    assert message in line, line


@pytest.mark.error_case("spec-invalid-value")
def test_a_float32_casts_setting_that_is_no_choice_is_refused_by_compare(tmp_path):
    """train.float32_casts (widen | keep, what a float64 run does with the model's own casts to
    float32) is checked with the spec, before any backend starts."""
    line = refused(
        "compare",
        tmp_path,
        "--backend",
        "jax",
        "--spec",
        "mlp-tiny",
        "--dtype",
        "float64",
        "--set",
        "train.float32_casts=widened",
    )
    assert "train.float32_casts=widened must be one of widen, keep" in line, line


@pytest.mark.error_case("fp32-tolerance-float64")
def test_a_float32_noise_floor_asked_of_a_float64_run_is_refused_not_ignored(tmp_path):
    line = refused(
        "compare",
        tmp_path,
        "--backend",
        "jax,torch",
        "--spec",
        "mlp-tiny",
        "--dtype",
        "float64",
        "--fp32-tolerance",
        "noise-floor",
    )
    assert line.startswith("error: --fp32-tolerance noise-floor: this run is float64"), line


@pytest.mark.slow
@pytest.mark.error_case(
    "env-bad", "flag-out-of-range", "whole-tensors-unknown", "match-behaviours-unknown"
)
@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ((), {"XLA_TWINS_COORDINATOR_WAIT_S": "inf"}, "XLA_TWINS_COORDINATOR_WAIT_S='inf' is not"),
        (("--capture-step", "-1"), {}, "'-1' is not a whole number of steps from 0 to"),
        (("--capture-step", "99999999999"), {}, "'99999999999' is not a whole number of steps"),
        (
            ("--capture-step", "9", "--activations-only"),
            {},
            "--capture-step 9: the run has steps 0 to 4 (train.steps = 5)",
        ),
        (("--throughput-steps", "-3"), {}, "'-3' is not a whole number of steps from 0"),
        (("--process-id", "-1"), {}, "argument --process-id: '-1' is not a whole number"),
        (("--whole-tensors", "foo"), {}, "'foo' is not GROUP/NAME with a group of grads, params"),
        (
            ("--parity", "--tensors", "summary", "--whole-tensors", "grads/nothing.kernel"),
            {},
            "--whole-tensors 'grads/nothing.kernel' names no parameter of this model (closest "
            "grads/hidden.1.kernel)",
        ),
        (
            ("--activations-only", "--impose-decisions", "/nonexistent"),
            {},
            "--impose-decisions /nonexistent: run record /nonexistent/record.json does not exist",
        ),
        (
            ("--match-behaviours", "embedding-padding-idx"),
            {},
            "--match-behaviours: embedding-padding-idx is not a named behaviour of the torch "
            "runtime (its own: none; common/runtime_behaviours.py)",
        ),
    ],
)
def test_a_backend_alone_refuses_a_bad_flag_or_variable_in_one_line(tmp_path, flags, env, message):
    line = refused(
        "torch_impl", tmp_path, "--spec", "mlp-tiny", "--steps", "5", *flags, env=env or None
    )
    assert message in line, line


@pytest.mark.error_case("cpu-peak-not-a-file")
def test_a_cached_cpu_peak_that_is_a_fifo_is_neither_read_nor_replaced(tmp_path):
    """A FIFO where the cached CPU peak belongs would block its read forever: it is left alone,
    said in one warning line, and the peak measured afresh."""
    os.mkfifo(tmp_path / "cpu_peak.json")
    code = (
        "import sys; from pathlib import Path; from compare.explain.figures import cpu_peak; "
        "flops, source = cpu_peak(Path(sys.argv[1])); print(flops > 0, source)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=REPO,
        env=process_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "True" and "cached" not in proc.stdout
    assert f"warning: {tmp_path / 'cpu_peak.json'} is not a regular file" in proc.stderr
    assert (tmp_path / "cpu_peak.json").is_fifo()


@pytest.mark.error_case("path-not-utf8")
def test_a_twin_in_a_folder_whose_name_is_not_utf8_is_refused_in_one_line(tmp_path):
    folder = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9")  # latin-1's é
    os.makedirs(folder)
    Path(folder, "twin.py").write_text((REPO / "examples" / "hf_gpt2" / "twin.py").read_text())
    line = refused("compare", tmp_path, "--backend", "jax,torch", "--twin", f"{folder}/twin.py:x")
    assert line == (
        f"error: --twin {tmp_path}/caf\\xe9/twin.py: its path is not UTF-8, and the toolkit writes "
        "paths into its JSON records; rename the folder (or file), or move it where the path is "
        "UTF-8"
    )

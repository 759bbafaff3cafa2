"""What a runtime cannot run, known before it trains (common/ops.py, compare/runs/orchestrate.py
check_ops): each runtime that checks ops runs one traced step of a user twin under its op watch
first; one that meets an op with no lowering (torchax) or a CPU fallback that fails (torch_xla) is
refused in one line naming the op, the others still train and are compared, and the report has every
runtime's table."""

import json

import pytest

from common.files.record import RECORD_FILE
from common.ops import OPS_DIR, found, refusal
from compare.reporting.check_tables import ops_tables
from tests.helpers import run_cli
from tests.test_examples import compare

MIXTRAL = "examples/mixtral/twin.py"


def test_a_runtime_is_refused_for_an_op_it_cannot_lower_or_a_failing_fallback_only():
    missing = found(
        "torchax",
        {"aten::mm": 4, "aten::_grouped_mm": 1},
        ["aten::_grouped_mm"],
        {},
        None,
        NotImplementedError("Operator with name aten::_grouped_mm has no lowering\nmore"),
    )
    assert (
        missing["error"]
        == "NotImplementedError: Operator with name aten::_grouped_mm has no lowering"
    )
    assert refusal(missing).startswith(
        "torchax cannot run this model: aten::_grouped_mm has no lowering in torchax"
    )
    failing = found(
        "torch_xla", {"aten::histc": 1}, [], {"aten::histc": 1}, "aten::histc", TypeError("int")
    )
    assert refusal(failing).startswith(
        "torch_xla cannot run this model: aten::histc runs as a CPU fallback and fails"
    )
    slow = found(
        "torch_xla", {"aten::median": 2, "aten::mm": 9}, [], {"aten::median": 2}, None, None
    )
    assert refusal(slow) is None and slow["calls"] == {"aten::median": 2, "aten::mm": 9}
    entry = {
        "ops": 2,
        "calls": 11,
        "missing": [],
        "fallbacks": {"aten::median": 2},
        "failed_op": None,
        "error": None,
        "refused": None,
    }
    ((_, header, rows),) = ops_tables({"ops": {"torch_xla": entry}})
    assert rows == [
        [
            "torch_xla",
            "2 (11 calls)",
            "-",
            "aten::median x2",
            "runs: 1 op(s) fall back to the CPU, each copying its tensors to the host and back in "
            "every step "
            "(its step time includes them)",
        ]
    ]


@pytest.mark.slow
@pytest.mark.error_case("runtime-cannot-run")
def test_mixtral_on_runtimes_that_cannot_run_it_is_refused_before_training_and_the_others_compared(
    tmp_path,
):
    """transformers' Mixtral on XLA devices takes its grouped-experts path: torch.histc on integer
    expert ids (a CPU fallback in torch_xla whose kernel takes no integers) and aten::_grouped_mm
    (no torchax lowering)."""
    out = tmp_path / "run"
    proc, report = compare(
        out,
        "--twin",
        f"{MIXTRAL}:mixtral_tiny",
        "--backend",
        "jax,torch,torch_xla,torchax",
        "--steps",
        "2",
    )
    assert proc.returncode == 3 and report["status"] == "backend_failed"
    statuses = {n: b["status"] for n, b in report["backends"].items()}
    assert statuses == {
        "jax": "ok",
        "torch": "ok",
        "torch_xla": "cannot_run",
        "torchax": "cannot_run",
    }
    assert report["parity"]["torch"]["passed"]  # the others still trained and were compared
    ops = report["ops"]
    assert ops["torchax"]["missing"] == ["aten::_grouped_mm"] and ops["torchax"]["ops"] > 10
    assert (
        ops["torch_xla"]["failed_op"] == "aten::histc"
        and "aten::histc" in ops["torch_xla"]["fallbacks"]
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert any(
        "torchax cannot run this model: aten::_grouped_mm has no lowering in torchax" in e
        for e in errors
    )
    assert any(
        "torch_xla cannot run this model: aten::histc runs as a CPU fallback and fails there" in e
        for e in errors
    )
    # refused before training: no run of theirs, only the checks' folders
    assert not (out / "torch_xla").exists() and not (out / "torchax").exists()
    assert sorted(p.name for p in (out / OPS_DIR).iterdir()) == ["torch_xla", "torchax"]
    assert not any((out / OPS_DIR / n / RECORD_FILE).exists() for n in ("torch_xla", "torchax"))
    assert json.loads((out / OPS_DIR / "torchax" / "ops.json").read_text())["runtime"] == "torchax"
    markdown = (out / "report.md").read_text()
    assert "## Ops: one traced step of each runtime" in markdown and "| torchax | " in markdown


@pytest.mark.slow
@pytest.mark.error_case("runtime-cannot-trace")
def test_a_model_that_reads_a_value_into_python_is_refused_on_torchax_before_anything_trains(
    tmp_path,
):
    """`if hidden.max() > 1e6` runs op by op (eager torch, the op check's own capture) but not in
    torchax's jitted step: the op check traces that step too, so torchax is refused before any
    backend trains, naming the model's line; eager torch still trains and is compared (it crashed
    after JAX trained, before). HF models that read values only where not traced still pass."""
    out = tmp_path / "run"
    proc, report = compare(
        out,
        "--twin",
        "tests/data/user_project/twins.py:reads_value",
        "--backend",
        "jax,torch,torchax",
        "--steps",
        "2",
    )
    assert proc.returncode == 3 and report["backends"]["torchax"]["status"] == "cannot_run"
    assert report["parity"]["torch"]["passed"]
    refused = report["ops"]["torchax"]["refused"]
    assert refused.startswith(
        "torchax cannot run this model in its jitted step: TracerBoolConversionError"
    ) or refused.startswith("torchax cannot run this model in its jitted step: Concretization")
    assert "tests/data/user_project/models.py:" in refused and "leave torchax out" in refused
    assert not (out / "torchax").exists()


@pytest.mark.slow
@pytest.mark.error_case("check-ops-refused")
def test_a_backend_with_no_op_watch_refuses_the_check_in_one_line(tmp_path):
    proc = run_cli(
        "jax_impl",
        "--spec",
        "mlp-tiny",
        "--activations-only",
        "--check-ops",
        "--out",
        str(tmp_path / "r"),
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip().splitlines()[-1]
        == "error: --check-ops: the jax backend has no op check (its registry row's checks_ops)"
    )
    assert not (tmp_path / "r").exists()

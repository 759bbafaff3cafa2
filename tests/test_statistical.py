"""Runs with dropout on every backend, and `--parity-mode statistical` judging them over seeds."""

import json

import pytest

from common.vocab import ReportStatus
from compare.judge.statistical import ALPHA, paired_t_test
from tests.helpers import run_cli


def test_paired_t_test_matches_scipy():
    from scipy import stats

    diffs = [0.012, -0.004, 0.007, 0.001, 0.009]
    t, p = paired_t_test(diffs)
    ref = stats.ttest_1samp(diffs, 0.0)
    assert t == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)
    assert paired_t_test([0.0, 0.0, 0.0]) == (0.0, 1.0)


def test_the_statistical_verdict_decides_and_failures_keep_their_status(monkeypatch):
    """In the statistical mode the parity check judges the settings and the statistical test the
    numbers: one verdict, made once (compare/judge/verdict.py)."""
    import compare.judge.statistical as statistical
    from compare.judge.verdict import decide
    from compare.reporting.report import parity_check, runs_check

    ok = {"backends": {"torch": {"passed": True, "p": 0.4, "mean_difference": 1e-4}}}
    bad = {"backends": {"torch": {"passed": False, "p": 0.001, "mean_difference": 0.05}}}
    parted = {
        "torch": {
            "comparable": True,
            "passed": False,
            "setting_differences": [],
            "intended_differences": [],
            "first_divergent_step": 0,
            "tensors": {},
            "worst": [],
        }
    }
    fine = runs_check(
        {"jax": {"status": "ok"}, "torch": {"status": "ok"}}, {"jax": 1, "torch": 1}, False
    )

    def check(result):
        monkeypatch.setattr(statistical, "judge", lambda *args: result)
        return statistical.statistical_check(None, ["jax", "torch"], "jax", [0, 1, 2])

    masks_differ = parity_check(parted, [], decides=False)
    assert decide([fine, masks_differ, check(ok)])[:2] == (ReportStatus.OK, 0)
    assert (
        decide([fine, parity_check(parted, [], decides=True), check(ok)])[0]
        == ReportStatus.PARITY_FAILED
    )
    assert decide([fine, masks_differ, check(bad)]) == (
        ReportStatus.PARITY_FAILED,
        1,
        (
            "torch: statistical parity failed: mean loss differs from jax's by 0.05 (paired "
            f"t-test p=0.001 < {ALPHA})"
        ),
    )
    crashed = runs_check(
        {"jax": {"status": "ok"}, "torch": {"status": "failed", "message": "boom"}},
        {"jax": 1, "torch": 1},
        False,
    )
    assert decide([crashed, masks_differ, check(ok)]) == (
        ReportStatus.BACKEND_FAILED,
        3,
        "torch: failed: boom",
    )
    assert check(bad).section is bad


@pytest.mark.error_case("dropout-deterministic", "statistical-seeds", "statistical-reused-record")
def test_random_runs_need_a_parity_mode_that_can_judge_them(tmp_path):
    proc = run_cli("compare", "--set", "model.dropout=0.1", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and not (tmp_path / "x").exists()
    assert proc.stderr.strip() == (
        "error: model.dropout=0.1 makes every run random (each framework draws its own "
        "masks): judge it with --parity-mode statistical, feed every backend the same masks "
        "with --parity-mode exact, or set model.dropout=0"
    )
    proc = run_cli(
        "compare", "--set", "model.dropout=0.1", "--parity-mode", "statistical", "--seeds", "2"
    )
    assert proc.returncode == 2
    assert (
        "--seeds 2: the statistical parity mode needs at least 3 seeds per backend" in proc.stderr
    )
    proc = run_cli(
        "compare",
        "--set",
        "model.dropout=0.1",
        "--parity-mode",
        "statistical",
        "--jax-record",
        str(tmp_path / "x"),
        "--out",
        str(tmp_path / "y"),
    )
    assert proc.returncode == 2 and not (tmp_path / "y").exists()
    assert proc.stderr.strip() == (
        "error: --parity-mode statistical runs every backend --seeds times; it cannot "
        "reuse --jax-record"
    )


@pytest.mark.slow
def test_dropout_runs_on_every_backend_and_passes_statistically(tmp_path):
    out = tmp_path / "run"
    proc = run_cli(
        "compare",
        "--out",
        str(out),
        "--quiet",
        "--backend",
        "all",
        "--spec",
        "gpt-tiny",
        "--steps",
        "5",
        "--set",
        "model.dropout=0.1",
        "--parity-mode",
        "statistical",
        "--seeds",
        "3",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    st = report["statistical"]
    assert report["parity_mode"] == "statistical" and st["seeds"] == [0, 1, 2]
    for name in ("torch", "torch_xla", "torchax"):  # measured p 0.18, 0.84, 0.17
        r = st["backends"][name]
        assert r["passed"] and r["p"] >= ALPHA and len(r["differences"]) == 3
        assert abs(r["mean_difference"]) < 0.01, (name, r)
    # gpt-tiny's first losses without dropout, every backend
    deterministic = [5.56057, 5.51348, 5.4337]
    for name in ("jax", "torch", "torch_xla", "torchax"):
        band = st["bands"][name]
        assert len(band["mean"]) == 5 and all(lo < hi for lo, hi in zip(band["min"], band["max"]))
        assert (out / "seeds" / "2" / name / "record.json").exists()
        # the RNG state adds no recompile
        assert report["backends"][name]["compiles"]["steady_state"] == 0
        losses = report["backends"][name]["losses"][:3]
        # dropout is really on
        assert max(abs(a - b) for a, b in zip(losses, deterministic)) > 5e-4, name
    md = (out / "report.md").read_text()
    assert "## Statistical parity against jax" in md and "| torchax | pass |" in md
    # step 0 parts by design (each framework's own masks): no capture run locates a "divergent"
    # module in it
    assert (
        not list(out.glob("*/activations"))
        and report["parity"]["torch"]["first_divergent_module"] is None
    )


@pytest.mark.slow
def test_a_real_difference_fails_statistically(tmp_path):
    out = tmp_path / "run"
    proc = run_cli(
        "compare",
        "--out",
        str(out),
        "--quiet",
        "--backend",
        "jax,torch",
        "--spec",
        "gpt-tiny",
        "--steps",
        "10",
        "--set",
        "model.dropout=0.1",
        "--torch-set",
        "model.dropout=0.3",
        "--parity-mode",
        "statistical",
        "--seeds",
        "3",
    )  # measured p=0.0003
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    r = report["statistical"]["backends"]["torch"]
    # more dropout, higher loss
    assert not r["passed"] and r["p"] < ALPHA and r["mean_difference"] > 0
    assert report["message"].startswith(
        "torch: statistical parity failed: mean loss differs from jax's by"
    )

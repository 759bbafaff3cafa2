"""`--parity-mode statistical`: runs with randomness (dropout) judged over K seeds, not bit by bit.

Every backend runs the spec with seeds s0 .. s0+K-1 (`--seeds K`). A seed fixes the start weights
and the batches, the same for every backend; the dropout masks come from each framework's own
generator, so two backends see different masks. Per seed, the statistic is the run's mean loss
over its steps; the differences other - reference, paired by seed (pairing removes what the seed's
weights and data do to the loss), go through a two-sided paired t-test. The backend passes when
p >= ALPHA. Under identical implementations the test's false-alarm rate is ALPHA by construction;
measured over 40 pairs of identical runs (`python -m benchmarks.false_alarm`): see
docs/performance.md. The report also gives every backend's per-step loss band (min, mean, max
over the seeds).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from common.files.record import RecordError, read_record
from common.vocab import ReportStatus
from compare.judge.verdict import CheckResult

ALPHA = 0.01
SEEDS_DIR = "seeds"
TEST = "two-sided paired t-test over seeds of the mean loss per run"


def seed_dirs(out: Path, name: str, seeds: list[int]) -> dict[int, Path]:
    """Where each seed's run of a backend lives: the main run for the first seed, seeds/<s>/<name>
    after."""
    return {
        s: out / name if i == 0 else out / SEEDS_DIR / str(s) / name for i, s in enumerate(seeds)
    }


def paired_t_test(differences: list[float]) -> tuple[float, float]:
    """(t, two-sided p) of the paired differences' mean against 0 (Student's t, n - 1 degrees of
    freedom)."""
    from scipy import stats  # only here: compare's start stays light

    d = np.asarray(differences, np.float64)
    sd = d.std(ddof=1)
    if sd == 0:
        return (0.0, 1.0) if d.mean() == 0 else (math.copysign(math.inf, d.mean()), 0.0)
    t = d.mean() / (sd / math.sqrt(len(d)))
    return float(t), float(2 * stats.t.sf(abs(t), len(d) - 1))


def _losses(run_dir: Path) -> list[float] | None:
    try:
        record = read_record(run_dir)
    except RecordError:
        return None
    losses = record.losses
    return None if record.status != "ok" or any(x is None for x in losses) else losses


def band(per_seed: list[list[float]]) -> dict:
    a = np.asarray(per_seed, np.float64)
    return {"min": a.min(0).tolist(), "mean": a.mean(0).tolist(), "max": a.max(0).tolist()}


def judge(out: Path, names: list[str], reference: str, seeds: list[int]) -> dict:
    """report.json's `statistical`: per backend its loss band, per other backend the test against
    the reference."""
    losses = {n: {s: _losses(d) for s, d in seed_dirs(out, n, seeds).items()} for n in names}
    result = {"test": TEST, "alpha": ALPHA, "seeds": seeds, "bands": {}, "backends": {}}
    for name in names:
        usable = [v for v in losses[name].values() if v is not None]
        if usable:
            result["bands"][name] = band(usable)
    for name in names:
        if name == reference:
            continue
        pairs = [(losses[reference][s], losses[name][s]) for s in seeds]
        missing = [s for s, (a, b) in zip(seeds, pairs) if a is None or b is None]
        if missing:
            result["backends"][name] = {
                "passed": False,
                "message": f"no usable run for seed(s) {missing}",
            }
            continue
        diffs = [float(np.mean(b) - np.mean(a)) for a, b in pairs]
        t, p = paired_t_test(diffs)
        result["backends"][name] = {
            "passed": p >= ALPHA,
            "p": p,
            "t": t,
            "mean_difference": float(np.mean(diffs)),
            "differences": diffs,
        }
    return result


def statistical_check(out: Path, names: list[str], reference: str, seeds: list[int]) -> CheckResult:
    """The statistical test decides the numbers' verdict (compare/judge/verdict.py): step-0 tensors
    and losses of one seed (report.parity) are shown but cannot agree when the masks differ."""
    result = judge(out, names, reference, seeds)
    failed = {n: r for n, r in result["backends"].items() if not r["passed"]}
    message = "; ".join(
        f"{n}: statistical parity failed: "
        + (
            r.get("message")
            or f"mean loss differs from {reference}'s by {r['mean_difference']:.3g} "
            f"(paired t-test p={r['p']:.3g} < {ALPHA})"
        )
        for n, r in failed.items()
    )
    return CheckResult(
        "statistical", ReportStatus.PARITY_FAILED if failed else ReportStatus.OK, message, result
    )

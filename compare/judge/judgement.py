"""What the judge makes of a run's evidence, typed: the extra runs read it to decide what to run
next (compare/runs/extra_runs.py), and the report is built from the last one, once
(compare/reporting/report.py report_of)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from common.spec import RunSpec
from common.vocab import ExitCode, ParityMode, ReportStatus
from compare.judge.verdict import CheckResult


@dataclass(frozen=True)
class ReportInputs:
    """What a run is judged by besides its runs, set once per compare run (never an argparse
    Namespace)."""

    spec: RunSpec
    policy: dict  # compare/judge/tolerances.py's policy for the spec's dtype
    names: list[str]  # the backends, in the order they ran
    reference: str
    out: Path
    run_id: str | None  # this run's; None: any record's is judged (no run of its own)
    tolerance_profile: str = "default"
    compile_cache: Path | None = None
    # the folder of the cached CPU peak (compare/runs/cache.py); None: measured
    cpu_peak_cache: Path | None = None
    # {backend: the spec fields its --<name>-set changed on purpose}
    intended: dict = field(default_factory=dict)
    parity_mode: str = ParityMode.DETERMINISTIC.value
    debug: bool = False
    # "noise-floor": each run judged against its noise-floor run (compare/judge/noise_floor.py)
    floor_policy: str = "fixed"
    # --require-same-device: backends on different devices are not comparable
    same_device: bool = False
    tensors: dict = field(default_factory=lambda: {"mode": "full"})  # --tensors: {mode, why}
    weights: str = ""  # where the start weights came from (compare/runs/prepare.py weights_origin)
    # a float32 floor measured where the fixed bounds contradicted the module checks
    floor_why: str = ""


@dataclass
class Judgement:
    """One judging of the evidence a run has so far: every backend's entry, the parity of each
    against the reference, every check's result and the verdict they make. A part that could not be
    judged is named in `not_built` ({part, why}), everything else kept."""

    inputs: ReportInputs
    runs: dict  # {backend: its main run (compare/runs/orchestrate.py)}
    backends: dict  # {backend: its report entry}
    records: dict  # {backend: its RunRecord}, those that can be judged
    tensors: dict  # {backend: its parity tensor groups}
    parity: dict | None  # {backend: its pair with the reference}; None: no pair finished
    tolerance_policy: dict  # the fixed bounds, or the noise floors measured
    results: list[CheckResult]  # the runs', the parity's, then every other check's
    status: ReportStatus
    code: ExitCode
    message: str
    ratios: dict
    pairwise_loss: dict
    not_built: list[dict]

    @property
    def reference(self) -> str:
        return self.inputs.reference

    @property
    def dtype(self) -> str:
        return self.inputs.spec.train.dtype

    def pairs(self) -> dict:
        """{backend: its parity with the reference} ({} when none was judged)."""
        return self.parity or {}

    def section(self, check: str):
        """What check `check` found (its report.json section), or None."""
        return next((r.section for r in self.results if r.check == check), None)

"""A kernel judged by its noise floor (the twin's `kernel_arg`: a side run with a Pallas kernel
where the other calls the reference op; compare/runs/kernel_runs.py makes the runs).

A flash-attention kernel in bfloat16 differs from SDPA in bfloat16 by more than any fixed bound
that a correct float32 kernel meets, and by less than a kernel bug: the kernel sums in another
order, in blocks, with an online softmax. Its maintainers' method measures instead how far each is
from a float64 oracle: the kernel's run in its dtype against the reference op's run in float64, set
beside the reference op's own run in that dtype against the same oracle. A tensor is within when

    max|kernel run - oracle| <= FACTOR * max|reference run - oracle| + eps(dtype) * max|oracle|

with all three runs on the kernel's side (same backend, start and batches; the kernel switch set to
the reference for the two others), so the only difference between the kernel's run and the
reference's is the kernel. What the kernel computes is judged: the step-0 outputs and gradients,
the loss step by step against the largest reference error up to that step, and with --activations
every captured module: the first module, in the order they finished, whose output is outside its
floor while its input is within names the kernel's module. Trained parameters are not: an adaptive
optimizer divides each gradient by its own size (Adam's first step moves a parameter by about lr
whatever its gradient), so a gradient near zero, where rounding is large against it, moves its
parameter by a rounding-sized draw that no factor over another run's draw bounds (a correct fused
RMSNorm was outside by 3% after one AdamW step); the pair's parity judges them by its own bounds.

In a float64 run the oracle is the reference's own float64 run, and the kernel is judged by the
float64 bounds of the run's tolerance profile. A kernel that does not run in float64 (jax's flash
kernels under `jax_enable_x64`) is said to be so, with its error: the references in float64 prove
the port without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.files.record import RECORD_FILE, RecordError, read_record
from common.files.tensor_file import read_tensors
from common.files.tensor_summary import TensorSummary
from common.vocab import BackendStatus, ReportStatus
from compare.judge.noise_floor import FACTOR, max_abs
from compare.judge.verdict import CheckResult

KERNELS_DIR = "kernels"  # <run>/kernels/<backend>/<run name>: a kernel side's floor runs
REFERENCE_RUN = "reference"  # the reference op in the run's dtype
ORACLE_RUN = "float64"  # the reference op in float64
# the groups of a run's tensors the floor judges (trained parameters: the pair's parity, above)
GROUPS = ("outputs", "grads", "activations")
EPS = {"float32": float(np.finfo(np.float32).eps), "bfloat16": 2.0**-7, "float64": 2.0**-52}


@dataclass(frozen=True)
class KernelSide:
    """A backend run with a kernel: its switch (`arg`), the kernel it ran and the reference."""

    arg: str
    kernel: str
    reference: str


def _read(path: Path, run_id: str | None) -> tuple[object, dict] | None:
    """(record, tensors) of a run of this compare run, or None where there is none."""
    try:
        record = read_record(path / RECORD_FILE)
        if run_id is not None and record.run_id != run_id:
            return None
        if record.status != BackendStatus.OK:
            return record, {}
        return record, read_tensors(path / RECORD_FILE, record)
    except (RecordError, OSError, KeyError):
        return None


def _finite(values) -> bool:
    """Every value finite (the errors are measured over the finite pairs: a kernel's NaN or
    infinity is outside by this)."""
    return bool(np.isfinite(np.asarray(values, np.float64)).all())


def _scale(values) -> float:
    values = np.asarray(values, np.float64)
    finite = values[np.isfinite(values)]
    return float(np.max(np.abs(finite))) if finite.size else 0.0


def _not_there(run: tuple | None, what: str) -> str:
    """Why a floor run has nothing to judge: how it ended, or that it was not made."""
    if run is None:
        return f"{what} was not made"
    return f"{what} ended {run[0].status}" + (f": {run[0].message}" if run[0].message else "")


def _same_run(a: tuple, b: tuple) -> bool:
    """Whether two runs' losses and whole tensors are equal bit for bit (a kernel switch that
    changed nothing)."""
    if list(a[0].losses) != list(b[0].losses):
        return False
    for group in GROUPS:
        x, y = a[1].get(group, {}), b[1].get(group, {})
        for name in set(x) | set(y):
            u, v = x.get(name), y.get(name)
            if isinstance(u, TensorSummary) or isinstance(v, TensorSummary):
                continue
            if u is None or v is None or not np.array_equal(u, v, equal_nan=True):
                return False
    return True


def floor_tensors(kernel: dict, reference: dict, oracle: dict, dtype: str) -> dict:
    """{group/name: {kernel_error, reference_error, bound, within}} of every tensor the three runs
    hold whole and alike (a summary or a shape that differs is left out: `unmeasured`); non-finite
    kernel values are outside."""
    out = {}
    for group in GROUPS:
        k, r, o = (run.get(group, {}) for run in (kernel, reference, oracle))
        for name in sorted(set(k) & set(r) & set(o)):
            errors = [max_abs(run[name], o[name]) for run in (k, r)]
            if None in errors:
                continue
            bound = FACTOR * errors[1] + EPS[dtype] * _scale(o[name])
            out[f"{group}/{name}"] = {
                "kernel_error": errors[0],
                "reference_error": errors[1],
                "bound": bound,
                "within": _finite(k[name]) and errors[0] <= bound,
            }
    return out


def floor_losses(kernel: list, reference: list, oracle: list, dtype: str) -> dict:
    """The loss step by step: step s's bound FACTOR times the reference's largest error up to s,
    plus eps(dtype) of the oracle's loss; the first step outside, or None."""
    running, first, steps = 0.0, None, []
    for step, (k, r, o) in enumerate(zip(kernel, reference, oracle)):
        if None in (k, r, o):
            break
        running = max(running, abs(r - o))
        bound = FACTOR * running + EPS[dtype] * abs(o)
        steps.append({"kernel_error": abs(k - o), "reference_error": abs(r - o), "bound": bound})
        if first is None and not abs(k - o) <= bound:
            first = step
    return {"steps": steps, "first_outside_step": first}


def first_module_outside(tensors: dict, order: list[str]) -> str | None:
    """The first module, in the order the kernel run's modules finished, whose output is outside its
    floor while its input (where captured) is within: the kernel's module."""
    for key in order:
        if key.endswith(":in"):
            continue
        row = tensors.get(f"activations/{key}")
        fed = tensors.get(f"activations/{key}:in")
        if row is not None and not row["within"] and (fed is None or fed["within"]):
            return key
    return None


def against_reference64(kernel: dict, reference: dict, policy: dict) -> dict:
    """A float64 run's kernel against its reference op in float64, by the float64 bounds."""
    out = {}
    kinds = {"outputs": "forward", "grads": "grad", "activations": "forward"}  # GROUPS
    for group, kind in kinds.items():
        k, r = kernel.get(group, {}), reference.get(group, {})
        for name in sorted(set(k) & set(r)):
            error = max_abs(k[name], r[name])
            if error is None:
                continue
            bound = policy[kind]["atol"] + policy[kind]["rtol"] * _scale(r[name])
            within = _finite(k[name]) and error <= bound
            out[f"{group}/{name}"] = {"error": error, "bound": bound, "within": within}
    return out


def judge_side(
    out: Path, name: str, side: KernelSide, dtype: str, run_id, policy: dict, failed: str | None
) -> dict:
    """One kernel side's section: its floor (or, in float64, the kernel against the reference), the
    first module outside it, and whether it passed; `failed`: how its run ended, if it failed."""
    folder = out / KERNELS_DIR / name
    section = {"arg": side.arg, "kernel": side.kernel, "reference": side.reference}
    main, ref = _read(out / name, run_id), _read(folder / REFERENCE_RUN, run_id)
    if failed or main is None or main[0].status != BackendStatus.OK:
        why = failed or (main[0].message if main else "its run left no record")
        # the kernel's own failure: its run crashed where the reference op's, the one difference,
        # ran (an interrupt, a timeout or a crash of both are the runs' to say)
        crashed = why.startswith(BackendStatus.FAILED) and ref is not None and bool(ref[1])
        if dtype == "float64" and crashed:
            return {**section, "passed": None, "float64": "unsupported", "why": why}
        return {**section, "passed": None, "why": f"its run failed ({why})", "runs_say": True}
    if ref is None or not ref[1]:
        why = _not_there(ref, "its reference run")
        return {**section, "passed": None, "why": why, "runs_say": True}
    if _same_run(main, ref):
        why = (
            f"its run computed bit for bit what its reference run did: setting {side.arg} to "
            f"{side.kernel!r} changed nothing (does the NNX factory know that kernel?)"
        )
        return {**section, "passed": None, "why": why}
    order = list((main[1].get("activations") or {}).keys())
    if dtype == "float64":
        tensors = against_reference64(main[1], ref[1], policy)
        section.update(judged_by="float64 bounds", float64="ran", tensors=tensors)
    else:
        oracle = _read(folder / ORACLE_RUN, run_id)
        if oracle is None or not oracle[1]:
            why = _not_there(oracle, "its float64 reference run")
            return {**section, "passed": None, "why": why, "runs_say": True}
        tensors = floor_tensors(main[1], ref[1], oracle[1], dtype)
        losses = floor_losses(main[0].losses, ref[0].losses, oracle[0].losses, dtype)
        section.update(judged_by="noise floor", factor=FACTOR, tensors=tensors, losses=losses)
    if not tensors:  # every tensor a summary (--tensors summary, or auto on a large model)
        why = "no tensor was kept whole (--tensors summary or auto): rerun with --tensors full"
        return {**section, "passed": None, "why": why}
    held = {f"{g}/{n}" for g in GROUPS for n in main[1].get(g, {})}
    section["not_measured"] = sorted(held - set(tensors))  # kept as summaries
    outside = sorted(k for k, t in tensors.items() if not t["within"])
    loss_step = (section.get("losses") or {}).get("first_outside_step")
    section.update(
        outside=outside,
        first_module=first_module_outside(tensors, order),
        passed=not outside and loss_step is None,
    )
    return section


def _failure(run) -> str | None:
    if run is None or run.status == BackendStatus.OK:
        return None
    return f"{run.status}: {run.message}"


def kernel_check(
    out: Path,
    sides: dict[str, KernelSide],
    dtype: str,
    run_id: str | None,
    policy: dict,
    runs: dict,
) -> CheckResult:
    """The `kernels` section and its verdict: every kernel side judged (judge_side); `runs`: the
    backends' runs, whose failures say why a kernel side has no record."""
    section = {
        n: judge_side(out, n, side, dtype, run_id, policy, _failure(runs.get(n)))
        for n, side in sides.items()
    }
    unsupported = [
        f"{name}'s kernel {judged['kernel']!r} does not run in float64 (its run failed): prove "
        f"the port in float64 by the reference ops (without model.{judged['arg']}) and the kernel "
        "in float32 and bfloat16 by its noise floor"
        for name, judged in section.items()
        if judged.get("float64", "").startswith("unsupported")
    ]
    if unsupported:
        return CheckResult("kernels", ReportStatus.BACKEND_FAILED, "; ".join(unsupported), section)
    unjudged = [
        f"{name}'s kernel {judged['kernel']!r} was not judged: {judged['why']}"
        for name, judged in section.items()
        if judged["passed"] is None and not judged.get("runs_say")
    ]
    if unjudged:
        return CheckResult("kernels", ReportStatus.NOT_COMPARABLE, "; ".join(unjudged), section)
    failures = []
    for name, judged in section.items():
        if judged["passed"] is False:
            where = f" at {judged['first_module']}" if judged["first_module"] else ""
            count = len(judged["outside"])
            failures.append(
                f"{name}'s kernel {judged['kernel']!r} is outside its noise floor{where} "
                f"({count} tensor(s) outside)"
                if dtype != "float64"
                else f"{name}'s kernel {judged['kernel']!r} differs from its reference in "
                f"float64{where} ({count} tensor(s) outside float64's bounds)"
            )
    status = ReportStatus.PARITY_FAILED if failures else ReportStatus.OK
    return CheckResult("kernels", status, "; ".join(failures), section)

"""The runs a kernel side gets besides its own (compare/judge/kernels.py judges them): a side
whose twin names a kernel switch (`Twin.kernel_arg`) and which runs another value of it than the
twin's (`--jax-set model.kernel=pallas`) runs once more with the reference op in the run's dtype
and, unless the run is float64, once in float64: <out>/kernels/<backend>/{reference,float64}/."""

from __future__ import annotations

from common.spec import TwinSpec
from common.twin import load_twin
from common.vocab import BackendStatus
from compare.judge.kernels import KERNELS_DIR, ORACLE_RUN, REFERENCE_RUN, KernelSide
from compare.options import CompareOptions
from compare.runs.extra_runs import note_failed
from compare.runs.launch import kernel_launch
from compare.runs.orchestrate import Plan, run_backend


def kernel_sides(opts: CompareOptions) -> dict[str, KernelSide]:
    """{backend: its kernel} of the backends that run a kernel other than the twin's reference."""
    spec = opts.spec_of(opts.names[0])
    if not isinstance(spec.model, TwinSpec):
        return {}
    twin = load_twin(spec.model.twin, frameworks_allowed=False, timeout_s=opts.timeout_s)
    arg = twin.kernel_arg
    if arg is None:
        return {}
    reference = twin.hparams[arg]
    sides = {n: opts.spec_of(n).model.hparams.get(arg, reference) for n in opts.names}
    return {n: KernelSide(arg, k, reference) for n, k in sides.items() if k != reference}


def kernel_runs(opts: CompareOptions, plan: Plan, outcome) -> None:
    """Each kernel side's reference runs (the module docstring), for the backends this compare ran
    (not a reused record). A float64 kernel run that failed still gets its reference run: the kernel
    is then said not to run in float64. A failed one is kept for the verdict."""
    if outcome.interrupted:
        return
    dtype = opts.spec_of(opts.names[0]).train.dtype
    for name, side in kernel_sides(opts).items():
        if name not in plan.launches or name not in outcome.runs:
            continue
        if outcome.runs[name].status != BackendStatus.OK and dtype != "float64":
            continue
        wanted = {REFERENCE_RUN: dtype} | ({ORACLE_RUN: "float64"} if dtype != "float64" else {})
        try:
            for run_name, run_dtype in wanted.items():
                run = run_backend(
                    name,
                    plan.pythons[name],
                    kernel_launch(opts, name, side.arg, side.reference, run_dtype),
                    plan.out / KERNELS_DIR / name / run_name,
                    plan.timeout_s,
                )
                note_failed(outcome, [run], f"the kernel's {run_name} run")
        except KeyboardInterrupt:
            outcome.interrupted = True
            return

"""The runs compare makes after the backends' own, each only when the report needs it: a noise-floor
run per backend (its dtype's policy, or a float32 pair whose fixed bounds contradict its module
checks), whole tensors where a summary left tolerance (`--tensors auto`), step 0's activations where
a pair parts at step 0 with no module found yet, and whole activations where a location was found on
their summaries."""

from __future__ import annotations

import dataclasses

from common import backends
from common.files.record import RECORD_FILE
from common.ops import OPS_DIR, read_ops
from common.runtime_behaviours import MATCHED_DIR, met
from common.vocab import BackendStatus, ParityMode, ReportStatus
from compare.judge.decided import needs_imposing
from compare.judge.generation import CAPTURE_SUBDIR, FLOOR_SUBDIR, GENERATION_DIR, capture_step
from compare.judge.noise_floor import FLOOR_DIR, floor_needed
from compare.judge.verdict import CheckResult
from compare.options import CompareOptions
from compare.runs.capture_runs import CAPTURE_DIR, IMPOSED_DIR, LATER_DIR, capture, parted_at_step0
from compare.runs.launch import (
    capture_launch,
    floor_launch,
    generate_launch,
    matched_launch,
    whole_launch,
)
from compare.runs.orchestrate import Plan, run_all, run_backend
from compare.runs.second_pass import WHOLE_DIR, activations_to_confirm, needs_whole

CONFIRM_PASSES = 3  # captures confirming a location found on summaries, at most


def note_failed(outcome, runs, what: str) -> None:
    """Keep each of `runs` (extra runs: `what` they were for) that failed on its own (killed,
    crashed, timed out) for the verdict; one ended by compare's own interrupt is the
    interrupt's."""
    for run in runs:
        if run.status not in (BackendStatus.OK, BackendStatus.INTERRUPTED):
            outcome.extra_failed.append((what, run))


def extra_runs_check(failed: list) -> CheckResult:
    """An extra run the verdict rests on that failed: the run is a backend failure (exit 3) naming
    it and how it ended, never a verdict made without it."""
    message = "; ".join(
        f"{what} of {run.name} failed: {run.status}: {run.message} (logs: {run.run_dir})"
        for what, run in failed
    )
    return CheckResult(
        "extra_runs", ReportStatus.BACKEND_FAILED if failed else ReportStatus.OK, message
    )


def noise_floor_runs(opts: CompareOptions, policy: str, plan: Plan, outcome) -> list[str]:
    """The backends run once more for their noise floor (compare/judge/noise_floor.py: bfloat16 in
    float32, float32 from jittered start weights) when their dtype's policy asks: every one that ran
    here (not a reused record) and finished, in the deterministic or exact mode (the statistical
    test judges its own way)."""
    if (
        policy != "noise-floor"
        or outcome.interrupted
        or opts.judging.parity_mode == ParityMode.STATISTICAL
    ):
        return []
    return [
        n for n in plan.launches if n in outcome.runs and outcome.runs[n].status == BackendStatus.OK
    ]


def run_noise_floors(
    opts: CompareOptions, policy: str, plan: Plan, outcome, dtype: str, live
) -> list[str]:
    """The noise-floor runs `noise_floor_runs` asks for, into <out>/noise-floor/; returns their
    backends. An interrupt marks the outcome; a run that failed is kept for the verdict."""
    floored = noise_floor_runs(opts, policy, plan, outcome)
    if floored:
        launches = {n: floor_launch(opts, n, dtype) for n in floored}
        folder = plan.out / FLOOR_DIR
        floor = run_all(
            Plan(floored, plan.pythons, launches, {}, folder, plan.timeout_s, False), live
        )
        outcome.interrupted = floor.interrupted
        note_failed(outcome, floor.runs.values(), "the noise-floor run")
    return floored


def floor_where_needed(opts: CompareOptions, plan: Plan, outcome, judged, rejudge):
    """The run judged again by `rejudge(why)` with a noise floor (compare/judge/noise_floor.py),
    when a float32 pair fails its fixed bounds where only a floor tells rounding from a port error
    (`floor_needed`): the reference and those backends run once more from jittered start weights.
    Not for summarized tensors (a floor of summaries measures nothing), reused records, the
    statistical mode or several hosts; unchanged otherwise."""
    if (
        outcome.interrupted
        or judged.inputs.tensors["mode"] != "full"
        or opts.judging.parity_mode == ParityMode.STATISTICAL
        or opts.hosts.hosts > 1
    ):
        return judged
    needed = floor_needed(judged)
    names = list(needed)
    if not names or not all(n in plan.launches for n in (judged.reference, *names)):
        return judged
    try:
        for name in (judged.reference, *names):
            run = run_backend(
                name,
                plan.pythons[name],
                floor_launch(opts, name, "float32"),
                plan.out / FLOOR_DIR / name,
                plan.timeout_s,
            )
            note_failed(outcome, [run], "the noise-floor run")
    except KeyboardInterrupt:
        outcome.interrupted = True
        return judged
    return rejudge(
        "measured because, judged by the fixed float32 bounds, "
        + "; ".join(f"{name}: {why}" for name, why in needed.items())
    )


def keep_whole(opts: CompareOptions, plan: Plan, outcome, floored: list[str], judged, rejudge):
    """The run (`judged` on its runs) judged again (`rejudge(interrupted)`) after a second
    pass of the backends whose summarized tensors left tolerance (compare/runs/second_pass.py), and
    of their noise-floor runs when they have one; unchanged when none did or the tensors were not
    summarized by `auto`. A reused record is not run again: its tensors are judged as it kept
    them."""
    if (
        opts.capture.tensors != "auto"
        or outcome.interrupted
        or opts.judging.parity_mode == ParityMode.STATISTICAL
        or opts.hosts.hosts > 1
    ):  # every host would have to run it: compare/runs/hosts.py
        return judged
    wanted = {n: keys for n, keys in needs_whole(judged).items() if n in plan.launches}
    if not wanted:
        return judged
    try:
        for name, keys in wanted.items():
            run_backend(
                name,
                plan.pythons[name],
                whole_launch(opts, name, keys),
                plan.out / name / WHOLE_DIR,
                plan.timeout_s,
            )
            if name in floored:
                run_backend(
                    name,
                    plan.pythons[name],
                    whole_launch(opts, name, keys, judged.dtype),
                    plan.out / FLOOR_DIR / name / WHOLE_DIR,
                    plan.timeout_s,
                )
    except KeyboardInterrupt:  # run_backend has taken the running one's process group down
        outcome.interrupted = True
    return rejudge(outcome.interrupted)


def locate_divergence(opts: CompareOptions, plan: Plan, outcome, judged, rejudge):
    """The run judged again with the activations of the backends that part at step 0 when there
    are any, captured now (not with --activations: the runs captured theirs), and with a location
    found on summaries confirmed whole. Not in the statistical mode: each framework draws its own
    dropout masks, so step 0 parts by design and its activations locate nothing."""
    if (
        outcome.interrupted
        or opts.judging.parity_mode == ParityMode.STATISTICAL
        or opts.hosts.hosts > 1
    ):  # every host would have to run it: compare/runs/hosts.py
        return judged
    parted, at = parted_at_step0(judged, plan.out, opts.capture.activations)
    parted = [n for n in parted if n in plan.launches]
    try:
        if parted:
            runs = capture(
                parted,
                plan.pythons,
                {n: capture_launch(opts, n, at=at) for n in parted},
                plan.out,
                plan.timeout_s,
            )
            outcome.capture_failed.update(failed_captures(runs))
            judged = rejudge(outcome.interrupted)
        return confirm_locations(
            opts, plan, impose_choices(opts, plan, judged, rejudge, at), rejudge, at
        )
    except KeyboardInterrupt:  # run_backend has taken the running one's process group down
        outcome.interrupted = True
        return rejudge(True)


def impose_choices(opts: CompareOptions, plan: Plan, judged, rejudge, at: tuple[int, int]):
    """The run judged again after the capture, with the reference's top-k/argmax/sort choices
    imposed, of each backend whose choices differ from the reference's at ties only and that can
    take them (compare/judge/decided.py), into `<backend>/activations/imposed/`; unchanged when
    there is none."""
    ref = judged.reference
    source = plan.out / ref / CAPTURE_DIR
    # a run that captured its own
    source = source if (source / RECORD_FILE).exists() else plan.out / ref
    wanted = [
        n
        for n, p in judged.pairs().items()
        if needs_imposing(p) and n in plan.launches and backends.info(n).imposes_decisions
    ]
    for name in wanted:
        run_backend(
            name,
            plan.pythons[name],
            capture_launch(opts, name, impose=source, at=at),
            plan.out / name / CAPTURE_DIR / IMPOSED_DIR,
            plan.timeout_s,
        )
    return rejudge(False) if wanted else judged


def failed_captures(runs: dict) -> dict[str, str]:
    """{backend: why} of the capture runs that failed."""
    return {
        n: f"{n}'s capture run {run.status}: {run.message}"
        for n, run in runs.items()
        if run.status != BackendStatus.OK
    }


def mark_failed_captures(judged, failed: dict[str, str]):
    """A pair whose capture run failed (`failed`: {backend: why}) says so where its location would
    be (`capture_failed`), not a bare '-'."""
    for name, parity in judged.pairs().items():
        why = failed.get(name) or failed.get(judged.reference)
        if why and not parity.get("first_divergent_module"):
            parity["capture_failed"] = why
    return judged


def confirm_locations(opts: CompareOptions, plan: Plan, judged, rejudge, at: tuple[int, int]):
    """A location found on summaries of the activations (a capture under --tensors summary|auto)
    confirmed by a capture that keeps its module's input and output whole on both sides
    (compare/runs/second_pass.py activations_to_confirm), into
    `<backend>/activations/whole-tensors/`. Whole, the input may turn out to differ in elements no
    summary sampled: the search then moves on, and the next location is confirmed in turn, up to
    CONFIRM_PASSES captures (each keeping every key asked so far); one left unconfirmed says so."""
    kept: dict[str, set[str]] = {}
    for _ in range(CONFIRM_PASSES):
        wanted = {
            n: keys for n, keys in activations_to_confirm(judged).items() if n in plan.launches
        }
        if not wanted:
            break
        for name, keys in wanted.items():
            kept.setdefault(name, set()).update(keys)
            run_backend(
                name,
                plan.pythons[name],
                capture_launch(opts, name, tuple(sorted(kept[name])), at=at),
                plan.out / name / CAPTURE_DIR / WHOLE_DIR,
                plan.timeout_s,
            )
        judged = rejudge(False)
    return judged


def choices_where_parted(opts: CompareOptions, plan: Plan, outcome, judged, rejudge):
    """The run judged again with both sides' top-k/argmax/sort choices at the step where a pair's
    runs part after a step 0 that agreed in everything (compare/judge/decided.py
    judge_later_choices): the reference and that backend trained to that step once more and captured
    on its whole batch, into `<backend>/activations/at-step-<s>/`. Only runtimes that capture from
    the weights their steps left (captures_later_steps); not in the statistical mode or on several
    hosts; unchanged when no pair parts so."""
    ref = judged.reference
    if (
        outcome.interrupted
        or opts.judging.parity_mode == ParityMode.STATISTICAL
        or opts.hosts.hosts > 1
        or ref not in plan.launches
        or not backends.info(ref).captures_later_steps
    ):
        return judged
    wanted = {
        n: p["first_divergent_step"]
        for n, p in judged.pairs().items()
        if n in plan.launches and backends.info(n).captures_later_steps and _parted_later(p)
    }
    try:
        for step in sorted(set(wanted.values())):
            for name in (ref, *(n for n, s in wanted.items() if s == step)):
                run_backend(
                    name,
                    plan.pythons[name],
                    capture_launch(opts, name, step=step),
                    plan.out / name / CAPTURE_DIR / f"{LATER_DIR}{step}",
                    plan.timeout_s,
                )
    except KeyboardInterrupt:  # run_backend has taken the running one's process group down
        outcome.interrupted = True
        return rejudge(True)
    return rejudge(False) if wanted else judged


def _parted_later(parity: dict) -> bool:
    """A pair whose runs part at a step after 0 that agreed in everything: its choices alike then,
    or not captured then (whether the model makes any is not known; a step-0 capture that found none
    says it makes none)."""
    if not (parity.get("unmeasured_noise") and parity.get("first_divergent_step")):
        return False
    found = parity.get("decisions")
    if found:
        return bool(found["matched"] and not found["flipped"])
    return not (parity.get("first_divergent_module") or {}).get("modules_compared")


def explain_by_behaviours(opts: CompareOptions, plan: Plan, outcome, judged, rejudge):
    """The run judged again (`rejudge(interrupted)`) after a behaviour-matched run of each backend
    whose parity failed where its op check found the model meets a named behaviour of its runtime
    (common/runtime_behaviours.py), into <out>/matched/<backend>/; unchanged when none did. Not in
    the statistical mode or across hosts."""
    if (
        outcome.interrupted
        or opts.judging.parity_mode == ParityMode.STATISTICAL
        or opts.hosts.hosts > 1
    ):
        return judged
    wanted = {
        name: list(met(read_ops(plan.out / OPS_DIR / name)))
        for name, parity in judged.pairs().items()
        if not parity.get("passed") and name in plan.launches
    }
    wanted = {name: ids for name, ids in wanted.items() if ids}
    if not wanted:
        return judged
    try:
        for name, ids in wanted.items():
            run = run_backend(
                name,
                plan.pythons[name],
                matched_launch(opts, name, ids),
                plan.out / MATCHED_DIR / name,
                plan.timeout_s,
            )
            note_failed(outcome, [run], "the behaviour-matched run")
    except KeyboardInterrupt:
        outcome.interrupted = True
        return judged
    return rejudge(outcome.interrupted)


def with_record(run):
    """`run`, failed where it exited 0 without writing its record (code it ran ended the process
    early: a `sys.exit` in the user's function, say)."""
    if run.status == BackendStatus.OK and not (run.run_dir / RECORD_FILE).exists():
        return dataclasses.replace(
            run,
            status=BackendStatus.FAILED,
            message=f"exited {run.exit_code} without writing its record (code it ran ended the "
            "process: sys.exit?)",
        )
    return run


def _generation_run(
    opts: CompareOptions,
    plan: Plan,
    outcome,
    name: str,
    folder,
    what: str = "the generation run",
    **launch,
):
    """One generation run of `name` into `folder` (compare/runs/launch.py generate_launch's
    `launch` keywords), failed where it left no record, a failure kept for the verdict as `what`."""
    run = with_record(
        run_backend(
            name, plan.pythons[name], generate_launch(opts, name, **launch), folder, plan.timeout_s
        )
    )
    note_failed(outcome, [run], what)
    return run


def generation_runs(opts: CompareOptions, plan: Plan, outcome) -> None:
    """--generate N: each backend's decode path run from the start weights into
    <out>/<backend>/generation/ (compare/judge/generation.py judges them): the reference's first,
    then every other backend's fed its tokens. Only runtimes that run decode paths (the report
    names the others); none when the reference cannot, or the run was interrupted."""
    ref = opts.reference
    names = [n for n in plan.launches if backends.info(n).generates]
    if not opts.capture.generate or outcome.interrupted or ref not in names:
        return
    fed_from = plan.out / ref / GENERATION_DIR
    # a bfloat16 decode judged by its noise floor: each side's float32 twin, fed the same tokens
    floors = opts.spec_of(ref).train.dtype == "bfloat16" and opts.judging.bf16 == "noise-floor"
    try:
        for name in (ref, *(n for n in names if n != ref)):
            fed = None if name == ref else fed_from
            run = _generation_run(
                opts, plan, outcome, name, plan.out / name / GENERATION_DIR, fed_from=fed
            )
            if name == ref and run.status != BackendStatus.OK:
                return
        for name in names if floors else ():
            folder = plan.out / name / GENERATION_DIR / FLOOR_SUBDIR
            what = "the generation run's float32 floor"
            _generation_run(opts, plan, outcome, name, folder, what, fed_from=fed_from, floor=True)
    except KeyboardInterrupt:  # run_backend has taken the running one's process group down
        outcome.interrupted = True


def locate_decode_divergence(opts: CompareOptions, plan: Plan, outcome, judged, rejudge):
    """The run judged again after the decode calls where a pair's decode paths part are captured
    module by module (compare/judge/generation.py locate_in_step): the reference's and that
    backend's, fed the reference's tokens, into <backend>/generation/at-step-<s>/. Only runtimes
    that capture their decode path; unchanged when no pair parts."""
    ref, section = opts.reference, judged.section("generation") or {}
    wanted = {
        name: capture_step(pair["first_divergent_step"])
        for name, pair in (section.get("pairs") or {}).items()
        if not pair["passed"]
        and name in plan.launches
        and all(backends.info(n).captures_decode for n in (ref, name))
    }
    if outcome.interrupted or ref not in plan.launches or not wanted:
        return judged
    fed_from = plan.out / ref / GENERATION_DIR
    try:
        for step in sorted(set(wanted.values())):
            for name in (ref, *(n for n, s in wanted.items() if s == step)):
                folder = plan.out / name / GENERATION_DIR / f"{CAPTURE_SUBDIR}{step}"
                what = "the decode step's capture"
                _generation_run(
                    opts, plan, outcome, name, folder, what, fed_from=fed_from, capture_step=step
                )
    except KeyboardInterrupt:  # run_backend has taken the running one's process group down
        outcome.interrupted = True
    return rejudge(outcome.interrupted)

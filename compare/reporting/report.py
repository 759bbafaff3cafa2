"""report.json: built from the backends' runs and records (rendered by `render.py`).

Its keys, each with what it holds: docs/report-json.md (schema_version 2).
"""

from __future__ import annotations

import enum
import functools
import json
import math
import sys
import traceback
from pathlib import Path

import numpy as np

from common.backends import info as backend_info
from common.files.record import RECORD_FILE, RecordError
from common.ops import OPS_DIR, read_ops
from common.runtime_behaviours import MATCHED_DIR, met
from common.twin.start_state import by_nnx_names, read_links
from common.vocab import BackendStatus, ExitCode, ParityMode, ReportStatus
from compare.explain.figures import backend_summary, wall_breakdown
from compare.judge.decided import IMPOSED, LATER
from compare.judge.devices import devices_check, one_device
from compare.judge.islands import widened_of
from compare.judge.judgement import Judgement, ReportInputs
from compare.judge.messages import failure_message
from compare.judge.noise_floor import FACTOR, FLOOR_DIR, FLOOR_TWIN, FloorRun, Floors
from compare.judge.parity import check_parity
from compare.judge.tolerances import load_policy, pair_policy
from compare.judge.verdict import CheckResult, decide, not_made
from compare.reporting.evidence import Evidence
from compare.runs.capture_runs import (
    CAPTURE_DIR,
    IMPOSED_DIR,
    capture_facts,
    captured_activations,
    later_choices,
)
from compare.runs.rundir import START_DIR
from compare.runs.second_pass import ACTIVATION_GROUPS, with_second_pass

REPORT_SCHEMA = 2


def strict_json(value, where: str = "report", problems: list[dict] | None = None):
    """`value` in plain JSON types, by the one rule report.json follows for numbers JSON cannot hold
    (it is strict JSON, written with allow_nan=False): a NaN or an infinity becomes the string
    "nan", "inf" or "-inf" (float() reads each back). numpy scalars and arrays become numbers and
    lists, tuples and sets lists, paths strings; anything else becomes its repr and is named in
    `problems` ({part, why})."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return (
            value
            if math.isfinite(value)
            else ("nan" if math.isnan(value) else "inf" if value > 0 else "-inf")
        )
    if isinstance(value, (np.generic, np.ndarray)):
        return strict_json(value.tolist(), where, problems)
    if isinstance(value, dict):
        return {
            k if isinstance(k, str) else str(k): strict_json(v, f"{where}.{k}", problems)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple, set, frozenset)):
        return [strict_json(v, f"{where}[{i}]", problems) for i, v in enumerate(value)]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, enum.Enum):
        return strict_json(value.value, where, problems)
    if problems is not None:
        problems.append(
            {"part": where, "why": f"{type(value).__name__} is not a JSON value: kept as its repr"}
        )
    return repr(value)


def strict_report(report: dict) -> dict:
    """`report`, in place, as strict JSON (`strict_json`; idempotent), then checked the way the
    writer will check it, before anything is written. A value that had to be replaced is named in
    `not_built`."""
    problems: list[dict] = []
    clean = strict_json(report, "report", problems)
    report.clear()
    report.update(clean)
    if problems:
        report["not_built"] = [*report.get("not_built", []), *problems]
    # raises on anything the writer would refuse: never a half report
    json.dumps(report, allow_nan=False)
    return report


def judge(
    inputs: ReportInputs,
    runs: dict,
    interrupted: bool,
    checks: tuple = (),
    evidence: Evidence | None = None,
) -> Judgement:
    """The run judged on its evidence so far, part by part: a part that cannot be judged (any
    Exception: a bad value, a bug) is left out and named in `not_built` ({part, why}) with
    everything else kept. The verdict is made once per judging (compare/judge/verdict.py) from the
    runs, the parity and `checks` ((name, callable returning a CheckResult) pairs: the statistical
    test, determinism); a check that cannot be made is an internal error (exit 6). `evidence`: the
    files read so far, kept between judgings of one run."""
    evidence = evidence or Evidence()
    not_built: list[dict] = []
    attempt = functools.partial(_attempt, not_built, inputs.debug)
    backends, records, tensors, unjudged = _entries(inputs, runs, attempt, evidence)
    floors, tolerance_policy = noise_floors_of(inputs, evidence)
    links = read_links(inputs.out / START_DIR)
    for name, groups in [*tensors.items(), *((n, floor.tensors) for n, floor in floors.items())]:
        _link_buffers(name, groups, links)
    parity = _parity(inputs, records, tensors, unjudged, attempt, evidence, floors)
    results = [
        runs_check(backends, runs, interrupted),
        parity_check(parity, unjudged, decides=inputs.parity_mode != ParityMode.STATISTICAL),
    ]
    for name, check in (
        ("devices", functools.partial(devices_check, records, inputs.same_device)),
        *checks,
    ):
        results.append(attempt(name, check) or not_made(name, not_built[-1]["why"]))
    status, code, message = decide(results)
    if not_built:
        message = "; ".join(
            filter(
                None,
                [
                    message,
                    "could not build "
                    + "; ".join(f"{part['part']} ({part['why']})" for part in not_built),
                ],
            )
        )
    return Judgement(
        inputs,
        runs,
        backends,
        records,
        tensors,
        parity,
        tolerance_policy,
        results,
        status,
        code,
        message,
        (attempt("ratios", ratios, backends, inputs.reference) or {})
        if one_device(results)
        else {},
        attempt("pairwise_loss", pairwise_loss, records) or {},
        not_built,
    )


def report_of(judged: Judgement) -> dict:
    """report.json's contents from the run's last judging (built once per run). The result is strict
    JSON (`strict_json`)."""
    inputs, spec, records, tensors = (
        judged.inputs,
        judged.inputs.spec,
        judged.records,
        judged.tensors,
    )
    report = {
        "schema_version": REPORT_SCHEMA,
        "verdict": "pass" if judged.code == ExitCode.OK else "fail",
        "status": judged.status,
        "exit_code": judged.code,
        "message": judged.message,
        "run_dir": str(inputs.out),
        "backend_names": inputs.names,
        "reference": inputs.reference,
        "spec_name": spec.name,
        "spec": spec.to_dict(),
        "dtype": spec.train.dtype,
        "bf16_mode": spec.train.bf16_mode if spec.train.dtype == "bfloat16" else None,
        "param_dtypes": {n: r.param_dtypes for n, r in records.items() if r.param_dtypes},
        "weights": inputs.weights,
        "tolerance_profile": inputs.tolerance_profile,
        "tolerances": inputs.policy,
        "tolerance_policy": judged.tolerance_policy,
        "parity_mode": inputs.parity_mode,
        "parity": judged.parity,
        "tensors": {
            **inputs.tensors,
            "second_pass": {n: t["second_pass"] for n, t in tensors.items() if "second_pass" in t},
        },
        "backends": judged.backends,
        "ratios": judged.ratios,
        "pairwise_loss": judged.pairwise_loss,
        "compile_cache": str(inputs.compile_cache) if inputs.compile_cache else None,
        "commands": {n: r.command for n, r in judged.runs.items() if r.command},
        **{r.check: r.section for r in judged.results[2:] if r.section is not None},
        "not_built": judged.not_built,
    }
    return strict_report(report)


def build_report(inputs: ReportInputs, runs: dict, interrupted: bool, checks: tuple = ()) -> dict:
    """The report of runs judged once (`judge`, `report_of`): a run with no extra runs."""
    return report_of(judge(inputs, runs, interrupted, checks))


def _entries(
    inputs: ReportInputs, runs: dict, attempt, evidence: Evidence
) -> tuple[dict, dict, dict, list]:
    """Per backend: its report entry, its record and parity tensors when they can be judged; and the
    backends whose record could not be (the verdict cannot pass without them)."""
    peak = functools.partial(evidence.cpu_peak, inputs.cpu_peak_cache)
    backends, records, tensors, unjudged = {}, {}, {}, []
    for name in inputs.names:
        run = runs.get(name)
        built = attempt(
            f"backends.{name}",
            _backend_entry,
            name,
            run,
            inputs.out,
            peak,
            len(inputs.names) > 1,
            inputs.run_id,
            attempt,
            evidence,
        )
        if built is None:  # its record could not be judged: the verdict cannot pass without it
            unjudged.append(name)
            built = (
                {
                    "status": BackendStatus.NOT_RUN if run is None else run.status,
                    "message": "" if run is None else run.message,
                },
                None,
                None,
            )
        backends[name], record, tensor_groups = built
        if record is not None:
            records[name] = record
        if tensor_groups is not None:
            tensors[name] = tensor_groups
    return backends, records, tensors, unjudged


def _link_buffers(name: str, groups: dict, links: dict[str, str]) -> None:
    """A torch runtime's buffers after training (backend `name`'s tensor `groups`) renamed to the
    NNX Variables the twin's start state links them to (`links`: common/twin/start_state.py), so
    that parity compares them with the NNX side's; none for a built-in model."""
    if links and backend_info(name).family == "torch" and groups.get("buffers"):
        groups["buffers"] = by_nnx_names(groups["buffers"], links)
        if groups.get("buffers_changed") is not None:
            groups["buffers_changed"] = [links.get(n, n) for n in groups["buffers_changed"]]


def _extra_run(path: Path, run_id: str | None, name: str, evidence: Evidence) -> tuple:
    """(record, parity tensors) of an extra run of this compare run that finished (a noise floor's,
    a behaviour-matched one's); raises RecordError or OSError otherwise."""
    record = evidence.record(path)
    check_belongs(record, path, run_id)
    if record.status != BackendStatus.OK:
        raise RecordError(f"{record.status}: {record.message}")
    tensors = with_second_pass(evidence.tensors(path, record), path.parent, record.run_id, name)
    return record, {**tensors, "buffers_changed": record.extra.buffers_changed}


def _runtime_behaviours(
    inputs: ReportInputs, name: str, ref: tuple, policy: dict, floors, evidence: Evidence
) -> dict | None:
    """The named behaviours of `name`'s runtime that its op check found the model meets
    (common/runtime_behaviours.py), and, where a behaviour-matched run was made
    (compare/runs/extra_runs.py explain_by_behaviours), that run judged against the reference
    (`ref`: its record and tensors) as the run itself was; None where the model meets none."""
    seen = met(read_ops(inputs.out / OPS_DIR / name))
    if not seen:
        return None
    path = inputs.out / MATCHED_DIR / name / RECORD_FILE
    if not path.exists():
        return {"met": seen}
    try:
        record, tensors = _extra_run(path, inputs.run_id, name, evidence)
        judged = check_parity(ref[0], record, ref[1], tensors, policy, intended=[], floors=floors)
    except (RecordError, OSError) as e:
        return {"met": seen, "matched": {"passed": None, "why": str(e)}}
    return {
        "met": seen,
        "matched": {
            "passed": judged["passed"],
            "worst": judged["worst"][:1],
            "run_dir": str(path.parent),
        },
    }


def noise_floors_of(inputs: ReportInputs, evidence: Evidence) -> tuple[dict[str, FloorRun], dict]:
    """Each backend's noise-floor run of this compare run (compare/judge/noise_floor.py: a bfloat16
    run's float32 twin, a float32 run's twin from jittered start weights), when the policy asks, and
    what the report says of the policy, with the backends that have none (a pair without both floors
    is judged by the fixed bounds)."""
    dtype = inputs.spec.train.dtype
    if inputs.floor_policy != "noise-floor":
        return {}, {
            "policy": "fixed",
            **({"why": "--bf16-tolerance fixed"} if dtype == "bfloat16" else {}),
        }
    floors, missing = {}, {}
    for name in inputs.names:
        path = inputs.out / FLOOR_DIR / name / RECORD_FILE
        try:
            record, tensors = _extra_run(path, inputs.run_id, name, evidence)
            floors[name] = FloorRun(record.losses, tensors)
        except (RecordError, OSError) as e:
            missing[name] = (
                f"no noise-floor run ({e}): its pair is judged by the fixed {dtype} bounds"
            )
    return floors, {
        "policy": "noise-floor",
        **({"why": inputs.floor_why} if inputs.floor_why else {}),
        "factor": FACTOR,
        "floor_runs": str(inputs.out / FLOOR_DIR),
        "rule": "max|other - ref| <= max(factor * max(noise of ref, noise of other), the float32 "
        f"bound), noise = max|run - {FLOOR_TWIN[dtype]}|",
        "not_measured": missing,
    }


def _parity(
    inputs: ReportInputs,
    records: dict,
    tensors: dict,
    unjudged: list,
    attempt,
    evidence: Evidence,
    floors: dict[str, FloorRun] | None = None,
) -> dict | None:
    """Every backend that finished, judged against the reference, even when another one failed; None
    unless the reference and another backend finished."""
    reference = inputs.reference
    if reference not in tensors or len(tensors) < 2:
        return None
    parity, fp32 = {}, load_policy(inputs.tolerance_profile, "float32") if floors else None
    for n in inputs.names:
        if n != reference and n in tensors:
            pair = (
                Floors(floors[reference], floors[n], fp32)
                if floors and {reference, n} <= set(floors)
                else None
            )
            policy, widened = pair_policy(
                inputs.policy,
                inputs.tolerance_profile,
                records[reference],
                records[n],
                has_state=bool(tensors[reference].get("state")),
            )
            judged = attempt(
                f"parity.{n}",
                check_parity,
                records[reference],
                records[n],
                tensors[reference],
                tensors[n],
                policy,
                intended=inputs.intended.get(reference, []) + inputs.intended.get(n, []),
                floors=pair,
            )
            if judged is None:
                unjudged.append(n)
                continue
            parity[n] = {**judged, **({"float64_allowances": widened} if widened else {})}
            parity[n]["float32_casts_widened"] = widened_of(records[reference], records[n])
            if (
                policy != inputs.policy
            ):  # the bounds this pair was judged by (render.py prints them)
                parity[n]["tolerances_applied"] = policy
            behaviours = attempt(
                f"parity.{n}.runtime_behaviours",
                _runtime_behaviours,
                inputs,
                n,
                (records[reference], tensors[reference]),
                policy,
                pair,
                evidence,
            )
            if behaviours:
                parity[n]["runtime_behaviours"] = behaviours
    return parity or None


def runs_check(backends: dict, runs: dict, interrupted: bool) -> CheckResult:
    """The backends' runs themselves: an interrupt, a usage error, a failure (crash, timeout,
    non-finite loss)."""
    failed = {n: b for n, b in backends.items() if b["status"] != BackendStatus.OK and n in runs}
    message = "; ".join(f"{n}: {b['status']}: {b['message']}" for n, b in failed.items())
    if interrupted:
        return CheckResult("backends", ReportStatus.INTERRUPTED, message)
    if any(b["status"] == BackendStatus.USAGE_ERROR for b in failed.values()):
        return CheckResult("backends", ReportStatus.USAGE_ERROR, message)
    return CheckResult(
        "backends", ReportStatus.BACKEND_FAILED if failed else ReportStatus.OK, message
    )


def parity_check(parity: dict | None, unjudged: list[str], decides: bool = True) -> CheckResult:
    """Parity against the reference: runs that differ in a setting they should share are not
    comparable; otherwise every judged backend must pass, unless another check decides the numbers
    (`decides` False: the statistical mode, whose masks differ). A backend that could not be judged
    leaves the verdict unmade."""
    if parity is not None and not all(p["comparable"] for p in parity.values()):
        return CheckResult(
            "parity",
            ReportStatus.NOT_COMPARABLE,
            "parity not judged: the runs differ in "
            + "; ".join(
                d
                for p in parity.values()
                for d in p["setting_differences"]
                if d not in p["intended_differences"]
            ),
        )
    if decides and parity is not None and not all(p["passed"] for p in parity.values()):
        return CheckResult(
            "parity",
            ReportStatus.PARITY_FAILED,
            "; ".join(failure_message(name, p) for name, p in parity.items() if not p["passed"]),
        )
    if unjudged:
        return CheckResult("parity", ReportStatus.INTERNAL_ERROR)
    return CheckResult("parity", ReportStatus.OK)


def _attempt(not_built: list[dict], debug: bool, part: str, build, *args, **kwargs):
    """build(*args, **kwargs), or None when it raises: the part is named in `not_built` with why,
    and a warning line goes to stderr (with --debug, the traceback)."""
    try:
        return build(*args, **kwargs)
    except Exception as e:  # any failure of one part must leave the rest of the report
        why = f"{type(e).__name__}: {e}".splitlines()[0]
        not_built.append({"part": part, "why": why})
        print(
            f"warning: report: {part} could not be built ({why}); report.json says so (not_built)",
            file=sys.stderr,
        )
        if debug:
            traceback.print_exc()
        return None


def _backend_entry(
    name: str,
    run,
    out: Path,
    peak,
    want_tensors: bool,
    run_id: str | None,
    attempt,
    evidence: Evidence,
):
    """(report entry, record or None, parity tensors or None) of one backend; a record of another
    run than this one (`run_id`), or one shorter than its spec, is not judged. A summary that cannot
    be built (`attempt`) leaves the record judged and the entry without it."""
    run_dir = run.run_dir if run is not None else out / name
    reused = run is not None and not run.command
    entry = {
        "status": BackendStatus.NOT_RUN if run is None else run.status,
        "message": "" if run is None else run.message,
        "exit_code": None if run is None else run.exit_code,
        "wall_s": None if run is None else run.wall_s,
        "record": str(run_dir / RECORD_FILE) if reused else f"{name}/{RECORD_FILE}",
        "logs": [] if reused else [f"{name}/stdout.log", f"{name}/stderr.log"],
        "reused_record": reused,
    }
    record, tensors = None, None
    record_path = run_dir / RECORD_FILE
    if run is not None and record_path.exists():
        try:
            candidate = evidence.record(record_path)
            check_belongs(candidate, record_path, None if reused else run_id)
            record = candidate
            entry.update(
                attempt(f"backends.{name}.summary", backend_summary, record, run_dir, peak) or {}
            )
            entry["wall_breakdown"] = attempt(
                f"backends.{name}.wall_breakdown",
                wall_breakdown,
                record,
                run.started_at,
                run.wall_s,
                run.described_at,
            )
            entry["status"] = (
                run.status if run.status != BackendStatus.OK else BackendStatus(record.status)
            )
            if record.status == BackendStatus.OK and want_tensors:
                tensors = with_second_pass(
                    evidence.tensors(record_path, record), run_dir, record.run_id, name
                )
                tensors.update(capture_facts(record), buffers_changed=record.extra.buffers_changed)
                # captured apart, when step 0 parted (compare/runs/capture_runs.py): the run's own
                # capture is replaced by one where the logits differ most
                captured = captured_activations(run_dir, run_id)
                if captured["activations"]:
                    tensors.update(captured)
                # with the reference's choices imposed, where the pair's differ at ties
                # only (compare/judge/decided.py)
                tensors[IMPOSED] = captured_activations(run_dir / CAPTURE_DIR, run_id, IMPOSED_DIR)
                # where runs part after step 0 (decided.py)
                tensors[LATER] = later_choices(run_dir, run_id)
                tensors = with_second_pass(
                    tensors,
                    run_dir / CAPTURE_DIR,
                    record.run_id,
                    name,
                    "activation_pass",
                    # a location on summaries, confirmed whole
                    ACTIVATION_GROUPS,
                )
        except RecordError as e:
            entry.update(status=BackendStatus.FAILED, message=str(e))
    elif run is not None and run.status == BackendStatus.OK:
        entry.update(status=BackendStatus.FAILED, message=f"exited 0 but wrote no {RECORD_FILE}")
    return entry, record, tensors


def check_belongs(record, path: Path, run_id: str | None) -> None:
    """A record compare may judge: written by this run (unless reused on purpose) and as long as its
    spec says, when it says it finished."""
    if run_id is not None and record.run_id != run_id:
        raise RecordError(
            f"run record {path} belongs to run {record.run_id}, not to this run {run_id}: a stale "
            "or foreign record is never judged"
        )
    steps = int(record.spec.get("train", {}).get("steps", 0))
    if record.status == BackendStatus.OK and len(record.steps) != steps:
        raise RecordError(
            f"run record {path} says ok but holds {len(record.steps)} of its {steps} steps "
            "(truncated or edited)"
        )


def ratios(backends: dict, reference: str) -> dict:
    """Each backend's median synced step and pipelined throughput over the reference's."""
    ref = backends.get(reference, {})
    ref_ms, ref_tp = (
        (ref.get("step_ms") or {}).get("median"),
        (ref.get("throughput") or {}).get("steps_per_s"),
    )
    out = {}
    for name, b in backends.items():
        ms, tp = (
            (b.get("step_ms") or {}).get("median"),
            (b.get("throughput") or {}).get("steps_per_s"),
        )
        if name != reference and ms and ref_ms:
            out[f"step_ms_median_{name}_over_{reference}"] = ms / ref_ms
        if name != reference and tp and ref_tp:
            out[f"throughput_{reference}_over_{name}"] = ref_tp / tp
    return out


def pairwise_loss(records: dict) -> dict:
    """Max |Δloss| over the common steps of every pair of backends (None where a step was
    non-finite)."""
    out, names = {}, list(records)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            pairs = zip(records[a].losses, records[b].losses)
            diffs = [abs(x - y) for x, y in pairs if x is not None and y is not None]
            out[f"{a} vs {b}"] = max(diffs) if diffs else None
    return out

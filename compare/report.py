"""report.json: built from the backends' runs and records (rendered by `render.py`).

report.json keys (schema_version 2):
  verdict                 "pass" | "fail"
  status                  a ReportStatus (common/vocab.py): ok | parity_failed | not_comparable |
                          nondeterministic | backend_failed | usage_error | interrupted
  exit_code               what `python -m compare` returned (an ExitCode)
  tolerances              {kind: {atol, rtol}} used for this dtype; distribution {kl_mean, top1}
  backend_names           the backends in the order they ran
  reference               the backend every other one is judged against (--reference)
  parity                  null unless the reference and another backend finished, else per other
                          backend that finished, against the reference:
    .<name>.checked, .comparable, .setting_differences, .intended_differences,
    .first_divergent_step (null when none; 0 when a step-0 tensor is out of tolerance),
    .first_divergent_module {step, module, input_agrees, output_error, modules_compared, modules_diverging}
      (null when every module's step-0 activation agrees), .loss {max_abs, per_step_abs, steps_compared},
    .tensors {"<group>/<name>": {abs, rel, within, kind}}, .worst [10 worst], .passed,
    .distribution {kl_mean, kl_max, top1, top5, positions, within} (step-0 logits; null without logits),
    .dropout_sites {reference, other, equal} (runs fed common's dropout masks; null otherwise)
  pairwise_loss           {"<a> vs <b>": max |Δloss| over the steps} for every pair of backends
  backends.<name>         status (a BackendStatus), message, exit_code, wall_s, record, logs,
    .compiles {setup, loop, steady_state, settle_steps, cache_hits, compile_s, causes},
    .step_ms {median, p10, p90, min, max, n}, .trace_ms (torch_xla), .throughput,
    .flops_per_step, .peak_flops, .peak_source, .mfu, .hlo_ops, .losses, .peak_rss_mb, .trace_mode,
    .hlo {available, hlo_file, kernels, fusions, dot, convolution, unfused_*, copies, transposes, rng,
      collectives {op: {count, elements, bytes}}, custom_calls, largest_buffers, matmul_flops,
      cost_analysis_flops, bytes_accessed, memory {argument/output/temp_size_in_bytes, peak_bytes, ...},
      memory_source, not_available {number: why}} (compare/program.py; `available: false, why` for eager),
    .compile_cache {enabled, dir, hits, misses, ...},
    .wall_breakdown {start_and_imports_s, compile_s, steps_s, other_s, total_s}
  backends.<name>.profile with --profile N: {available, trace, tool, steps, median_ms {step, device, host,
                          call, wait, input}, our_clock_median_ms, loop_step_median_ms, vs_loop_step,
                          unprofiled_step_median_ms, vs_synced_step,
                          device_source, top_device_ops_ms_per_step} (compare/profile.py), or {available: false, why}
  compile_cache           the cache directory compare gave the backends (null with --no-compile-cache)
  wall_time               compare_imports_s, backends_s, report_s, total_s (compare's own process)
  ratios                  per backend over the reference: median step time, pipelined throughput
  determinism             with --check-determinism: per backend {bitwise_equal, max_abs, steps}
  parity_mode, statistical  with --parity-mode statistical: {test, alpha, seeds, bands {<name>: {min, mean,
                          max} per step}, backends {<name>: {passed, p, t, mean_difference, differences}}}; it
                          decides the verdict (compare/statistical.py)
"""
from __future__ import annotations

import functools
from pathlib import Path

from common.record import RECORD_FILE, RecordError, read_record, read_tensors
from common.vocab import REPORT_STATUS_EXIT, BackendStatus, ExitCode, ReportStatus
from compare.parity import check_parity
from compare.summary import backend_summary, cpu_peak, wall_breakdown

REPORT_SCHEMA = 2


def build_report(args, spec, policy, names: list[str], reference: str, runs: dict, out: Path,
                 interrupted: bool) -> dict:
    peak = functools.lru_cache(maxsize=1)(functools.partial(cpu_peak, args.compile_cache))
    backends, records, tensors = {}, {}, {}
    for name in names:
        backends[name], record, tensor_groups = _backend_entry(name, runs.get(name), out, peak, len(names) > 1)
        if record is not None:
            records[name] = record
        if tensor_groups is not None:
            tensors[name] = tensor_groups
    parity = None  # every backend that finished is judged, even when another one failed
    if reference in tensors and len(tensors) > 1:
        intended = {n: [o.split("=")[0] for o in getattr(args, f"{n}_set")] for n in names}
        parity = {n: check_parity(records[reference], records[n], tensors[reference], tensors[n], policy,
                                  intended=intended[reference] + intended[n])
                  for n in names if n != reference and n in tensors}
    status = _status(backends, runs, parity, interrupted)
    code = REPORT_STATUS_EXIT[status]
    report = {
        "schema_version": REPORT_SCHEMA, "verdict": "pass" if code == ExitCode.OK else "fail", "status": status,
        "exit_code": code, "message": _message(status, backends, parity), "run_dir": str(out),
        "backend_names": names, "reference": reference,
        "spec_name": spec.name, "spec": spec.to_dict(), "dtype": spec.train.dtype,
        "tolerance_profile": args.tolerance_profile, "tolerances": policy, "parity": parity,
        "backends": backends, "ratios": ratios(backends, reference),
        "pairwise_loss": pairwise_loss(records),
        "compile_cache": str(args.compile_cache) if args.compile_cache else None,
        "commands": {n: r.command for n, r in runs.items() if r.command},
    }
    return report


def _backend_entry(name: str, run, out: Path, peak, want_tensors: bool):
    """(report entry, record or None, parity tensors or None) of one backend."""
    run_dir = run.run_dir if run is not None else out / name
    reused = run is not None and not run.command
    entry = {"status": BackendStatus.NOT_RUN if run is None else run.status,
             "message": "" if run is None else run.message, "exit_code": None if run is None else run.exit_code,
             "wall_s": None if run is None else run.wall_s,
             "record": str(run_dir / RECORD_FILE) if reused else f"{name}/{RECORD_FILE}",
             "logs": [] if reused else [f"{name}/stdout.log", f"{name}/stderr.log"], "reused_record": reused}
    record, tensors = None, None
    record_path = run_dir / RECORD_FILE
    if run is not None and record_path.exists():
        try:
            record = read_record(record_path)
            entry.update(backend_summary(record, run_dir, peak))
            entry["wall_breakdown"] = wall_breakdown(record, run.started_at, run.wall_s)
            entry["status"] = run.status if run.status != BackendStatus.OK else BackendStatus(record.status)
            if record.status == BackendStatus.OK and want_tensors:
                tensors = read_tensors(record_path, record)
        except RecordError as e:
            entry.update(status=BackendStatus.FAILED, message=str(e))
    elif run is not None and run.status == BackendStatus.OK:
        entry.update(status=BackendStatus.FAILED, message=f"exited 0 but wrote no {RECORD_FILE}")
    return entry, record, tensors


def _status(backends: dict, runs: dict, parity: dict | None, interrupted: bool) -> ReportStatus:
    problems = [b["status"] for n, b in backends.items() if b["status"] != BackendStatus.OK and n in runs]
    if interrupted:
        return ReportStatus.INTERRUPTED
    if BackendStatus.USAGE_ERROR in problems:
        return ReportStatus.USAGE_ERROR
    if problems:
        return ReportStatus.BACKEND_FAILED
    if parity is not None and not all(p["comparable"] for p in parity.values()):
        return ReportStatus.NOT_COMPARABLE
    if parity is not None and not all(p["passed"] for p in parity.values()):
        return ReportStatus.PARITY_FAILED
    return ReportStatus.OK


def _message(status: ReportStatus, backends: dict, parity: dict | None) -> str:
    if status == ReportStatus.NOT_COMPARABLE:
        return "parity not judged: the runs differ in " + "; ".join(
            d for p in parity.values() for d in p["setting_differences"] if d not in p["intended_differences"])
    if status == ReportStatus.PARITY_FAILED:
        return "; ".join(_failure(name, p) for name, p in parity.items() if not p["passed"])
    failed = [f"{n}: {b['status']}: {b['message']}" for n, b in backends.items() if b["status"] != BackendStatus.OK]
    return "; ".join(failed)


def _failure(name: str, parity: dict) -> str:
    worst = parity["worst"][0] if parity["worst"] else None
    step = parity["first_divergent_step"]
    where = f"{name}: parity failed: first divergent step {step if step is not None else 'none'}"
    module = parity.get("first_divergent_module")
    if module:
        where += f", first divergent module {module['module']}"
    sites = parity.get("dropout_sites")
    if sites and not sites["equal"]:
        where += (f", dropout calls differ ({len(sites['reference'])} in the reference, {len(sites['other'])} "
                  f"here: run records' extra.dropout_sites)")
    return where + (f"; worst tensor {worst['name']} (max abs {worst['abs']:.3g}, within={worst['within']})"
                    if worst else "")


def ratios(backends: dict, reference: str) -> dict:
    """Each backend's median synced step and pipelined throughput over the reference's."""
    ref = backends.get(reference, {})
    ref_ms, ref_tp = (ref.get("step_ms") or {}).get("median"), (ref.get("throughput") or {}).get("steps_per_s")
    out = {}
    for name, b in backends.items():
        ms, tp = (b.get("step_ms") or {}).get("median"), (b.get("throughput") or {}).get("steps_per_s")
        if name != reference and ms and ref_ms:
            out[f"step_ms_median_{name}_over_{reference}"] = ms / ref_ms
        if name != reference and tp and ref_tp:
            out[f"throughput_{reference}_over_{name}"] = ref_tp / tp
    return out


def pairwise_loss(records: dict) -> dict:
    """Max |Δloss| over the common steps of every pair of backends (None where a step was non-finite)."""
    out, names = {}, list(records)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pairs = zip(records[a].losses, records[b].losses)
            diffs = [abs(x - y) for x, y in pairs if x is not None and y is not None]
            out[f"{a} vs {b}"] = max(diffs) if diffs else None
    return out

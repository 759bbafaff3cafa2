"""python -m compare: run both twins on this device and report parity, compile counts and step time.

Exit codes: 0 everything ran and parity passed; 1 parity failed (or the two
runs are not comparable); 2 bad usage or input; 3 a backend failed (crashed,
timed out, non-finite loss); 4 interrupted.
"""
from __future__ import annotations

import time

STARTED_AT = time.time()  # before the imports below, so the wall-time breakdown counts them

import argparse
import functools
import shutil
import signal
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from common.cli import (EXIT_BACKEND, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_PARITY, EXIT_USAGE,
                        INPUT_ERRORS, add_run_flags, fail, resolve_spec, run_flags_argv)
from common.fsutil import write_json_atomic, write_text_atomic
from common.record import RECORD_FILE, RecordError, read_record, read_tensors
from compare import parity as parity_mod
from compare.orchestrate import BACKEND_MODULES, BackendRun, run_backend
from compare.plots import write_plots
from compare.report import REPORT_SCHEMA, markdown, print_tables, ratios
from compare.summary import backend_summary, measured_cpu_peak, wall_breakdown
from compare.tolerances import PROFILES, ToleranceError, load_policy


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="both", help="both | jax | torch_xla (default both)")
    add_run_flags(parser)
    parser.add_argument("--out", type=Path, help="run directory (default runs/compare-<time>)")
    parser.add_argument("--overwrite", action="store_true", help="reuse an --out that already holds a finished run")
    parser.add_argument("--jax-python", default=sys.executable, help="interpreter of the JAX environment")
    parser.add_argument("--torch-xla-python", default=sys.executable, help="interpreter of the torch_xla environment")
    parser.add_argument("--torch-xla-mode", choices=("lazy", "compile", "dynamo"), default="lazy",
                        help="how torch_xla turns the step into a graph: lazy tracing + torch_xla.sync() (the "
                             "classic loop, default), torch_xla.compile, or torch.compile(backend='openxla')")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per backend before it is killed")
    parser.add_argument("--tolerance-profile", default="default",
                        help=f"{' | '.join(PROFILES)} or a JSON file {{dtype: {{kind: {{atol, rtol}}}}}}")
    parser.add_argument("--jax-set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override a spec field for the JAX side only (a deliberate difference)")
    parser.add_argument("--torch-xla-set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override a spec field for the torch_xla side only (a deliberate difference)")
    parser.add_argument("--jax-record", type=Path, metavar="DIR",
                        help="compare this existing JAX run (a directory with record.json) instead of running it")
    parser.add_argument("--torch-xla-record", type=Path, metavar="DIR",
                        help="compare this existing torch_xla run instead of running it")
    parser.add_argument("--check-determinism", action="store_true",
                        help="run each backend twice and require bitwise-identical per-step losses")
    parser.add_argument("--quiet", action="store_true", help="no live progress and no tables")
    parser.add_argument("--json", action="store_true", help="print only the JSON report")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks")
    return parser.parse_args(argv)


def backends_of(choice: str) -> list[str]:
    if choice == "both":
        return list(BACKEND_MODULES)
    if choice in BACKEND_MODULES:
        return [choice]
    fail(f"--backend {choice!r} is unknown; use both, jax or torch_xla", EXIT_USAGE)


def prepare_out_dir(args) -> Path:
    out = args.out or Path("runs") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    if (out / "report.json").exists():
        if not args.overwrite:
            fail(f"{out} already holds a finished run (report.json); pass --overwrite or another --out", EXIT_USAGE)
        shutil.rmtree(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        fail(f"run directory {out} is not writable ({e.strerror or e}); pass a writable --out", EXIT_USAGE)
    return out


class LiveProgress:
    """A rich progress bar per backend: step, loss, step time."""

    def __init__(self, enabled: bool, steps: int):
        self.steps = steps
        self.progress = Progress(TextColumn("{task.description:>10}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("loss {task.fields[loss]}  {task.fields[ms]} ms/step"),
                                 TimeElapsedColumn(), console=Console(stderr=True), disable=not enabled)

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def task(self, name: str):
        task = self.progress.add_task(name, total=self.steps, loss="-", ms="-")

        def update(step, loss, ms):
            self.progress.update(task, completed=step + 1, loss=f"{loss:.4f}", ms=f"{ms:.2f}")

        return update


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    args = parse_args(argv)
    names = backends_of(args.backend)
    try:
        spec = resolve_spec(args)
        side_specs = {side: resolve_spec(_with(args, extra))
                      for side, extra in (("jax", args.jax_set), ("torch_xla", args.torch_xla_set))}
        policy = load_policy(args.tolerance_profile, spec.train.dtype)
    except (*INPUT_ERRORS, ToleranceError) as e:
        fail(str(e), EXIT_USAGE)
    del side_specs  # validated up front: a bad per-side override fails before any backend runs
    given = {n: p for n, p in (("jax", args.jax_record), ("torch_xla", args.torch_xla_record)) if p and n in names}
    for name, path in given.items():  # a corrupt record is bad input: say so before running anything
        try:
            record = read_record(path)
            if record.status == "ok" and len(names) == 2:
                read_tensors(path, record)
        except RecordError as e:
            fail(f"--{name.replace('_', '-')}-record: {e}", EXIT_USAGE)
    out = prepare_out_dir(args)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    runs: dict[str, BackendRun] = {}
    interrupted = False
    pythons = {"jax": args.jax_python, "torch_xla": args.torch_xla_python}
    extra = {"jax": args.jax_set, "torch_xla": args.torch_xla_set}
    backend_flags = {"jax": [], "torch_xla": ["--trace-mode", args.torch_xla_mode]}
    main_started = time.time()
    repeats: dict[str, BackendRun] = {}
    current = None
    try:
        with LiveProgress(not (args.quiet or args.json), spec.train.steps) as live:
            for name in names:
                if name in given:
                    runs[name] = BackendRun(name, given[name].resolve(), "ok", 0, "", 0.0, [])
                    continue
                current = name
                argv_b = (run_flags_argv(args) + [a for item in extra[name] for a in ("--set", item)]
                          + backend_flags[name] + ["--parity"])
                runs[name] = run_backend(name, pythons[name], argv_b, out / name, args.timeout, live.task(name))
                if args.check_determinism and runs[name].status == "ok":
                    repeats[name] = run_backend(name, pythons[name], argv_b, out / f"{name}-repeat", args.timeout,
                                                live.task(f"{name} again"))
            current = None
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: run_backend already took the running backend down
        interrupted = True
        if current is not None:
            runs.setdefault(current, BackendRun(current, out / current, "interrupted", None,
                                                "interrupted by a signal; its process group was terminated", 0.0, []))
    backends_done = time.time()
    report = build_report(args, spec, policy, names, runs, out, interrupted)
    if args.check_determinism:
        report = add_determinism(report, runs, repeats)
    report["wall_time"] = {"compare_imports_s": main_started - STARTED_AT, "backends_s": backends_done - main_started,
                           "report_s": time.time() - backends_done, "total_s": time.time() - STARTED_AT,
                           "note": "compare's own interpreter start (before its first line) is not included"}
    write_json_atomic(out / "report.json", report)
    write_text_atomic(out / "report.md", markdown(report))
    if args.json:
        print((out / "report.json").read_text(), end="")
    elif not args.quiet:
        print_tables(report)
    for run in runs.values():
        if run.status != "ok":
            print(f"error: {run.name}: {run.status}: {run.message} (logs: {run.run_dir})", file=sys.stderr)
    return report["exit_code"]


def _with(args, side_overrides):
    clone = argparse.Namespace(**vars(args))
    clone.overrides = list(args.overrides) + list(side_overrides)
    return clone


def build_report(args, spec, policy, names, runs, out: Path, interrupted: bool) -> dict:
    cpu_peak = functools.lru_cache(maxsize=1)(measured_cpu_peak)
    backends, records, tensors, problems = {}, {}, {}, []
    for name in names:
        run = runs.get(name)
        run_dir = run.run_dir if run is not None else out / name
        reused = run is not None and not run.command
        entry = {"status": "not_run" if run is None else run.status, "message": "" if run is None else run.message,
                 "exit_code": None if run is None else run.exit_code, "wall_s": None if run is None else run.wall_s,
                 "record": str(run_dir / RECORD_FILE) if reused else f"{name}/{RECORD_FILE}",
                 "logs": [] if reused else [f"{name}/stdout.log", f"{name}/stderr.log"], "reused_record": reused}
        record_path = run_dir / RECORD_FILE
        if run is not None and record_path.exists():
            try:
                record = read_record(record_path)
                records[name] = record
                entry.update(backend_summary(record, run_dir, cpu_peak))
                entry["wall_breakdown"] = wall_breakdown(record, run.started_at, run.wall_s)
                entry["status"] = run.status if run.status != "ok" else record.status
                if record.status == "ok" and len(names) == 2:
                    tensors[name] = read_tensors(record_path, record)
            except RecordError as e:
                entry.update(status="failed", message=str(e))
        elif run is not None and run.status == "ok":
            entry.update(status="failed", message=f"exited 0 but wrote no {RECORD_FILE}")
        if entry["status"] != "ok" and run is not None:
            problems.append(entry["status"])
        backends[name] = entry

    parity = None
    if len(names) == 2 and all(n in tensors for n in names):
        parity = check_parity(records["jax"], records["torch_xla"], tensors["jax"], tensors["torch_xla"], policy,
                              intended=[o.split("=")[0] for o in args.jax_set + args.torch_xla_set])

    if interrupted:
        status, code = "interrupted", EXIT_INTERRUPTED
    elif "usage_error" in problems:
        status, code = "usage_error", EXIT_USAGE
    elif problems:
        status, code = "backend_failed", EXIT_BACKEND
    elif parity is not None and not parity["comparable"]:
        status, code = "not_comparable", EXIT_PARITY
    elif parity is not None and not parity["passed"]:
        status, code = "parity_failed", EXIT_PARITY
    else:
        status, code = "ok", EXIT_OK
    report = {
        "schema_version": REPORT_SCHEMA, "verdict": "pass" if code == EXIT_OK else "fail", "status": status,
        "exit_code": code, "message": _message(status, backends, parity), "run_dir": str(out),
        "spec_name": spec.name, "spec": spec.to_dict(), "dtype": spec.train.dtype,
        "tolerance_profile": args.tolerance_profile, "tolerances": policy, "parity": parity,
        "backends": backends, "ratios": ratios(backends),
        "commands": {n: r.command for n, r in runs.items() if r.command},
    }
    report["plots"] = write_plots(report, out)
    return report


def add_determinism(report: dict, runs: dict, repeats: dict) -> dict:
    """Per backend: are the per-step losses of two identical runs bitwise equal?"""
    result = {}
    for name, repeat in repeats.items():
        try:
            first, second = read_record(runs[name].run_dir).losses, read_record(repeat.run_dir).losses
        except RecordError as e:
            result[name] = {"bitwise_equal": False, "message": f"repeat run unusable: {e}"}
            continue
        diffs = [abs(a - b) for a, b in zip(first, second) if a is not None and b is not None]
        result[name] = {"bitwise_equal": first == second, "max_abs": max(diffs) if diffs else None,
                        "steps": len(first)}
    report["determinism"] = result
    if report["exit_code"] == EXIT_OK and not all(r["bitwise_equal"] for r in result.values()):
        report.update(status="nondeterministic", exit_code=EXIT_PARITY, verdict="fail",
                      message="two identical runs differ: " + ", ".join(n for n, r in result.items()
                                                                         if not r["bitwise_equal"]))
    return report


def check_parity(ref, other, ref_tensors, other_tensors, policy, intended: list[str]) -> dict:
    differences = parity_mod.setting_differences(ref, other)
    unexplained = [d for d in differences if d.split(":")[0] not in intended]
    tensors = parity_mod.compare_tensors(ref_tensors, other_tensors, policy)
    loss = parity_mod.compare_losses(ref.losses, other.losses, policy["loss"])
    comparable = not unexplained
    passed = comparable and loss["first_divergent_step"] is None and all(t["within"] for t in tensors.values())
    return {"checked": True, "comparable": comparable, "setting_differences": differences,
            "intended_differences": [d for d in differences if d not in unexplained],
            "first_divergent_step": loss["first_divergent_step"], "loss": loss, "tensors": tensors,
            "worst": parity_mod.worst_tensors(tensors), "passed": passed}


def _message(status: str, backends: dict, parity: dict | None) -> str:
    if status == "not_comparable":
        return "parity not judged: the runs differ in " + "; ".join(
            d for d in parity["setting_differences"] if d not in parity["intended_differences"])
    if status == "parity_failed":
        worst = parity["worst"][0] if parity["worst"] else None
        step = parity["first_divergent_step"]
        return (f"parity failed: first divergent step {step if step is not None else 'none'}; worst tensor "
                f"{worst['name']} (max abs {worst['abs']}, within={worst['within']})" if worst else "parity failed")
    failed = [f"{n}: {b['status']}: {b['message']}" for n, b in backends.items() if b["status"] != "ok"]
    return "; ".join(failed)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    except Exception as e:  # a bug in compare itself: one line, the traceback with --debug
        if "--debug" in sys.argv:
            raise
        fail(f"internal error in compare: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
             EXIT_INTERNAL)

"""The `python -m <backend>` driver every backend shares: flags, run directory, record, exit code.

A backend supplies `train(spec, options, progress) -> (record, tensors, is_writer)` (its trainer run
through driver.harness.run); this module reads its command line once into a
driver.harness.RunOptions and handles everything around the run the same way for all.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import statistics
import sys
import time
import traceback
from pathlib import Path

from common import backends
from common.capture.decisions import read_decisions
from common.cli import INPUT_ERRORS, SpecInputs, fail, resolve_spec
from common.environment import check_environment
from common.files.fsutil import dangerous_dir, write_json_atomic
from common.files.record import (
    LOG_FILES,
    PROCESS_LOGS,
    RECORD_FILE,
    SPEC_FILE,
    RunRecord,
    timed_from,
    write_record,
)
from common.files.shards import SHARDS_DIR, write_shards
from common.files.tensor_file import write_tensors
from common.ops import OPS_FILE
from common.protocol import progress_line
from common.runtime_behaviours import NAMED, of_runtime
from common.spec import SpecError
from common.vocab import IO_ERRNOS, ExitCode, Phase, RecordStatus
from driver.harness import RunOptions
from driver.nonfinite import input_problem, likely_cause
from driver.process import backend_parser, check_whole_tensors


def progress_printer(enabled: bool):
    """`--progress`: one machine-readable line per step on stdout, for `compare`'s live display."""
    if not enabled:
        return None

    def show(step: int, loss: float, wall_ms: float) -> None:
        print(progress_line(step, loss, wall_ms), flush=True)

    return show


def summary_line(record: RunRecord, out_dir: Path) -> str:
    losses = [x for x in record.losses if x is not None]
    timed = [s.wall_ms for s in record.steps[timed_from(record) :]]
    loop = [e for e in record.compile_events if e.phase == Phase.LOOP]
    steady = [e for e in loop if e.step >= record.settle_steps]
    first, last = (f"{losses[0]:.4f}", f"{losses[-1]:.4f}") if losses else ("-", "-")
    median = f"{statistics.median(timed):.3f} ms" if timed else "-"
    return (
        f"{record.backend}: {record.status} | loss {first} -> {last} | median step {median} | "
        f"loop compiles {len(loop)} (steady-state {len(steady)}) | {out_dir}"
    )


def first_words(e: Exception) -> str:
    """An error's first line, and the line after it where the first ends announcing it with a colon
    (jax's shard_map: "... not evenly divisible by the corresponding mesh axis sizes:" then the
    sizes)."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]


def raise_crash(backend: str, e: Exception, debug: bool) -> None:
    """One line and exit 3. The exit skips the interpreter's shutdown: after a framework raised
    mid-step its threads may never finish (seen: torch eager after a failed backward hung at exit
    with 3 threads in a futex), and a crashed backend must end, not wait for compare's --timeout."""
    if debug:
        raise e
    print(
        f"error: {backend} crashed: {type(e).__name__}: {first_words(e)} (rerun with --debug for "
        "the traceback)",
        file=sys.stderr,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(ExitCode.BACKEND))


def io_failure(out_dir: Path, e: OSError, debug: bool) -> None:
    if debug:
        traceback.print_exc()
    fail(
        f"cannot write the results to {out_dir}: {e.strerror or e} (disk full, or the directory "
        "became "
        "unwritable); free space or pass another --out",
        ExitCode.IO,
    )


def nonfinite_cause(spec, record: RunRecord) -> str:
    step = len(record.losses) - 1
    try:
        problem = input_problem(spec, step)
    except Exception:  # the data cannot be read again: judge from the losses alone
        problem = None
    return likely_cause(spec, record.losses, problem)


def refuse_foreign_out(out_dir: Path, logs: tuple[str, ...] = ()) -> None:
    """A backend writes (and clears its scratch folders) only in a new or empty directory or an
    earlier run's of its own (one with a record.json, or only its logs: a run that failed): never
    among the user's files."""
    why = dangerous_dir(out_dir)
    if why:
        fail(
            f"--out {out_dir}: {why}; give the run a directory of its own, e.g. --out runs/my-run",
            ExitCode.USAGE,
        )
    ours = {*LOG_FILES, SPEC_FILE, *logs}
    # compare --processes' logs and a multi-process run's shard files: its own only while they hold
    # nothing else
    for folder, pattern in ((PROCESS_LOGS, r"process-\d+\.log"), (SHARDS_DIR, r"process-\d+\.npz")):
        if (out_dir / folder).is_dir() and all(
            re.fullmatch(pattern, n) for n in os.listdir(out_dir / folder)
        ):
            ours.add(folder)
    if (
        out_dir.is_dir()
        and set(os.listdir(out_dir)) - ours
        and not (out_dir / RECORD_FILE).exists()
    ):
        fail(
            f"--out {out_dir} holds files this toolkit did not write (no {RECORD_FILE}); pass a "
            "new or empty "
            "directory",
            ExitCode.USAGE,
        )


def run_options(args: argparse.Namespace, own: type, out_dir: Path) -> RunOptions:
    """The options of this run, read once; `own`: the dataclass of the backend's own flags (its
    add_flags')."""
    return RunOptions(
        parity=args.parity,
        tensors=args.tensors,
        whole_tensors=args.whole_tensors,
        activations=args.activations or args.activations_only,
        train=not (args.activations_only or args.generate),
        checkpoint=args.checkpoint,
        throughput_steps=args.throughput_steps,
        provocations=tuple(args.provoke),
        profile_steps=args.profile,
        hlo=not args.no_hlo,
        compile_cache=args.compile_cache,
        out_dir=out_dir,
        own=own(**{f.name: getattr(args, f.name) for f in dataclasses.fields(own)}),
        impose_decisions=args.impose_decisions,
        capture_at=args.capture_at,
        capture_step=args.capture_step,
        match_behaviours=args.match_behaviours,
        check_ops=args.check_ops,
        generate=args.generate,
        generate_tokens=args.generate_tokens,
        capture_decode_step=args.capture_decode_step,
    )


def check_ops(name: str, ops_watch, step, out_dir: Path) -> int:
    """--check-ops: the one traced step (`step`, a capture run) under the runtime's op watch; what
    it saw written into OPS_FILE, whatever the step ended on (the file is the result: compare reads
    it)."""
    watch, error = ops_watch(), None
    try:
        with watch:
            step()
    # the step's end: an op it cannot lower, a fallback that failed, or the model's own
    except Exception as e:
        error = e
    try:
        write_json_atomic(out_dir / OPS_FILE, watch.found(error))
    except OSError as e:
        io_failure(out_dir, e, False)
    return ExitCode.OK


def refuse_flags(name: str, args: argparse.Namespace, ops_watch) -> None:
    """What can be refused from the command line and the environment alone, before any spec is
    read: each one line naming the flag (or variable), exit 2."""
    try:
        check_environment()  # every variable the toolkit reads, once (common/environment.py)
    except INPUT_ERRORS as e:
        fail(str(e), ExitCode.USAGE)
    if args.impose_decisions and not backends.info(name).imposes_decisions:
        fail(
            f"--impose-decisions: the {name} backend cannot take another side's decisions; only "
            + ", ".join(b.name for b in backends.registry().values() if b.imposes_decisions)
            + " can",
            ExitCode.USAGE,
        )
    if args.impose_decisions:  # read once now: a bad one is named by its flag, before anything runs
        try:
            read_decisions(args.impose_decisions)
        except (*INPUT_ERRORS, OSError, KeyError, ValueError) as e:
            fail(
                f"--impose-decisions {args.impose_decisions}: {getattr(e, 'strerror', None) or e}; "
                "give the run directory of a capture run (--activations-only) of this twin",
                ExitCode.USAGE,
            )
    if args.capture_step and not (
        args.activations_only and backends.info(name).captures_later_steps
    ):
        fail(
            "--capture-step: takes --activations-only and a backend that captures from the "
            "weights training left; "
            f"the {name} backend "
            + ("does not" if args.activations_only else "was not given --activations-only"),
            ExitCode.USAGE,
        )
    unknown = [b for b in args.match_behaviours if b not in {x.id for x in of_runtime(name, NAMED)}]
    if unknown:
        fail(
            f"--match-behaviours: {unknown[0]} is not a named behaviour of the {name} runtime "
            f"(its own: {', '.join(x.id for x in of_runtime(name, NAMED)) or 'none'}; "
            "common/runtime_behaviours.py)",
            ExitCode.USAGE,
        )
    if (args.generate or args.generate_tokens) and not backends.info(name).generates:
        fail(
            f"--generate: the {name} backend does not run decode paths yet; "
            + ", ".join(b.name for b in backends.registry().values() if b.generates)
            + " do",
            ExitCode.USAGE,
        )
    if (args.generate_tokens or args.capture_decode_step is not None) and not args.generate:
        fail(
            "--generate-tokens, --capture-decode-step: take --generate N (the run they are of)",
            ExitCode.USAGE,
        )
    if args.capture_decode_step is not None and not (
        backends.info(name).captures_decode and 0 <= args.capture_decode_step <= args.generate
    ):
        fail(
            f"--capture-decode-step {args.capture_decode_step}: "
            + (
                f"a step from 0 (the prefill) to {args.generate}"
                if backends.info(name).captures_decode
                else f"the {name} backend does not capture its decode path"
            ),
            ExitCode.USAGE,
        )
    if args.check_ops and ops_watch is None:
        fail(
            f"--check-ops: the {name} backend has no op check (its registry row's checks_ops)",
            ExitCode.USAGE,
        )


def main(
    package: str, argv, add_flags, train, check=None, logs: tuple[str, ...] = (), ops_watch=None
) -> int:
    """`python -m <package>`, the backend that common/backends.py registers under that package: its
    row names the run (record.backend). `check(spec, options)`: the backend's own refusals of
    flag combinations, before a run directory exists; `logs`: files it writes beside its record,
    left by a run that failed (a directory holding only those is its own); `ops_watch()`: its op
    watch, for --check-ops (common/ops.py)."""
    name, backend = backends.of_package(package).name, package
    parser: argparse.ArgumentParser = backend_parser(package)
    parser.add_argument("--progress", action="store_true", help="print a progress line per step")
    own = add_flags(parser)  # the dataclass its own flags are read into
    args = parser.parse_args(argv)
    refuse_flags(name, args, ops_watch)
    out_dir = args.out or Path("runs") / f"{backend}-{time.strftime('%Y%m%d-%H%M%S')}"
    options = run_options(args, own, out_dir)
    try:
        spec = resolve_spec(SpecInputs.of(args))
        check_whole_tensors(options.whole_tensors, spec)
        if 0 < args.capture_step >= spec.train.steps:
            raise SpecError(
                f"--capture-step {args.capture_step}: the run has steps 0 to "
                f"{spec.train.steps - 1} (train.steps = {spec.train.steps}); capture at a step "
                "from 1 to its last, or train more steps"
            )
        if check:
            check(spec, options)
    except INPUT_ERRORS as e:
        fail(str(e), ExitCode.USAGE)
    refuse_foreign_out(out_dir, logs)
    created = not out_dir.exists()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(
            f"cannot create run directory {out_dir}: {e.strerror or e}; pass a writable --out",
            ExitCode.USAGE,
        )
    if args.check_ops:
        return check_ops(name, ops_watch, lambda: train(spec, options, None), out_dir)
    try:
        record, tensors, is_writer = train(spec, options, progress_printer(args.progress))
    except OSError as e:
        if e.errno not in IO_ERRNOS:
            raise_crash(backend, e, args.debug)
        io_failure(out_dir, e, args.debug)
    except INPUT_ERRORS as e:
        if args.debug:
            traceback.print_exc()
        # refused input: no empty run directory is left behind
        if created and not any(out_dir.iterdir()):
            out_dir.rmdir()
        fail(str(e), ExitCode.USAGE)
    # a crash inside the framework: one line, the traceback only with --debug
    except Exception as e:
        raise_crash(backend, e, args.debug)
    # a runtime copied under another name is that name
    record.backend, record.run_id = name, args.run_id
    if record.status == RecordStatus.NONFINITE:  # the message says what most likely did it
        record.message += f"; likely cause: {nonfinite_cause(spec, record)}"
    # a multi-process run's whole tensors: each process writes its own shards
    # (common/files/shards.py)
    try:
        write_shards(out_dir, tensors)
    except OSError as e:
        io_failure(out_dir, e, args.debug)
    if is_writer:
        try:
            if tensors:
                record.tensors = write_tensors(
                    out_dir, tensors, options.tensors, frozenset(options.whole_tensors)
                )
            write_record(out_dir, record)
        except OSError as e:  # atomic writes: nothing half-written is left behind
            io_failure(out_dir, e, args.debug)
        print(summary_line(record, out_dir), flush=True)
    if record.status == RecordStatus.NONFINITE:
        print(f"error: {record.message}", file=sys.stderr)
        return ExitCode.NONFINITE
    return ExitCode.OK if record.status == RecordStatus.OK else ExitCode.BACKEND

"""python -m compare: run the twins on this device and report parity, compile counts and step time.

Exit codes: common.vocab.ExitCode (README and docs/errors.md list them).
"""

from __future__ import annotations

import time

STARTED_AT = time.time()  # before the imports below, so the wall-time breakdown counts them

import dataclasses  # noqa: E402
import functools  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from common import backends  # noqa: E402
from common.backends import FAMILIES  # noqa: E402
from common.cli import (  # noqa: E402
    INPUT_ERRORS,
    Parser,
    add_no_hlo_flag,
    add_profile_flag,
    add_run_flags,
    bounded_int,
    fail,
    resolve_spec,
)
from common.data import make_dataset  # noqa: E402
from common.environment import check_environment  # noqa: E402
from common.files.fsutil import not_utf8, symlink_loop  # noqa: E402
from common.files.record import RecordError, peak_rss_mb, read_record  # noqa: E402
from common.files.tensor_file import TENSOR_MODES, read_tensors  # noqa: E402
from common.ops import OPS_DIR  # noqa: E402
from common.procs import exit_process  # noqa: E402
from common.runtime_behaviours import MATCHED_DIR  # noqa: E402
from common.twin.start_state import STATE_LINKS  # noqa: E402
from common.vocab import (  # noqa: E402
    CHECKPOINT_FORMAT_MEANINGS,
    PARITY_MODE_MEANINGS,
    BackendStatus,
    CheckpointFormat,
    ExitCode,
    ParityMode,
    ReportStatus,
    values,
)
from compare.judge.determinism import determinism_check  # noqa: E402
from compare.judge.generation import generation_check  # noqa: E402
from compare.judge.judgement import Judgement, ReportInputs  # noqa: E402
from compare.judge.kernels import KERNELS_DIR, kernel_check  # noqa: E402
from compare.judge.noise_floor import FLOOR_DIR, floor_policy  # noqa: E402
from compare.judge.parity import ran_differences  # noqa: E402
from compare.judge.start_state import start_state_check  # noqa: E402
from compare.judge.statistical import SEEDS_DIR, statistical_check  # noqa: E402
from compare.judge.tolerances import PROFILES, ToleranceError, load_policy  # noqa: E402
from compare.options import CompareOptions  # noqa: E402
from compare.reporting.check_tables import ops_check  # noqa: E402
from compare.reporting.evidence import Evidence  # noqa: E402
from compare.reporting.output import show, write_report  # noqa: E402
from compare.reporting.plots import PLOT_FILES, import_while_idle  # noqa: E402
from compare.reporting.report import check_belongs, judge, report_of  # noqa: E402
from compare.runs import hosts, meeting  # noqa: E402
from compare.runs.arg_types import positive_seconds, run_id_arg  # noqa: E402
from compare.runs.cache import default_cache_dir, peak_cache_dir  # noqa: E402
from compare.runs.extra_runs import (  # noqa: E402
    choices_where_parted,
    explain_by_behaviours,
    extra_runs_check,
    floor_where_needed,
    generation_runs,
    keep_whole,
    locate_decode_divergence,
    locate_divergence,
    mark_failed_captures,
    run_noise_floors,
)
from compare.runs.kernel_runs import kernel_runs, kernel_sides  # noqa: E402
from compare.runs.launch import (  # noqa: E402
    describing_runs,
    main_launch,
    model_variants,
    op_check_launches,
    seed_launch,
    side_spec,
)
from compare.runs.orchestrate import Plan, install_signal_handlers, run_all  # noqa: E402
from compare.runs.prepare import INIT_FILE, SPEC_FILE, Prepared, prepare_start, weights_origin  # noqa: E402
from compare.runs.progress import LiveProgress  # noqa: E402
from compare.runs.rundir import START_DIR, RunDirError, claim, default_out, new_run_id  # noqa: E402
from compare.runs.rundir import check as check_out  # noqa: E402
from compare.runs.second_pass import tensor_mode  # noqa: E402
from compare.runs.warm import WarmInterpreters  # noqa: E402

REPORT_FILES = ("report.json", "report.md")
MAX_SEEDS = 100  # each seed is a whole run of every backend
MAX_NEW_TOKENS = 4096  # --generate: each is one decode step of every backend


def parse_args(argv):
    return build_parser().parse_args(argv)


def add_judging_flags(parser: Parser) -> None:
    """How the runs are judged: the tolerance profile, each dtype's noise-floor policy, the parity
    mode and its seeds."""
    parser.add_argument(
        "--tolerance-profile",
        default="default",
        help=f"{' | '.join(PROFILES)} or a JSON file {{dtype: {{kind: {{atol, rtol}}}}}}",
    )
    parser.add_argument(
        "--bf16-tolerance",
        choices=("noise-floor", "fixed"),
        default="noise-floor",
        help="bfloat16 runs: bound each tensor and step by the larger of the two runs' own "
        "bf16-vs-fp32 distances (one float32 run of each backend more; "
        "compare/judge/noise_floor.py), "
        "or by the profile's fixed bf16 atol/rtol",
    )
    parser.add_argument(
        "--fp32-tolerance",
        choices=("noise-floor", "fixed"),
        default="fixed",
        help="float32 runs: the profile's fixed bounds, or (for long runs, where training grows "
        "rounding until correct ports part) each tensor and step bounded by how far a run from "
        "jittered start weights drifts (one more run of each backend; "
        "compare/judge/noise_floor.py)",
    )
    parser.add_argument(
        "--parity-mode",
        choices=values(ParityMode),
        default=ParityMode.DETERMINISTIC.value,
        help="; ".join(f"{m.value}: {meaning}" for m, meaning in PARITY_MODE_MEANINGS.items()),
    )
    parser.add_argument(
        "--seeds",
        type=bounded_int(1, MAX_SEEDS, "seeds"),
        default=5,
        metavar="K",
        help="seeds per backend in the statistical parity mode (default 5, at least 3; each is a "
        "whole run of every backend)",
    )


def build_parser() -> Parser:
    """compare's command line (docs/reference/cli.md is generated from it: docs/reference.py)."""
    parser = Parser(prog="python -m compare", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--backend",
        default="both",
        help=f"both (= {','.join(both())}, the default) | all | a comma list of "
        f"{', '.join(backends.names())}",
    )
    parser.add_argument(
        "--reference",
        help="the backend every other is judged against (default jax when it "
        "runs, else the first listed)",
    )
    add_run_flags(parser)
    parser.add_argument(
        "--twin",
        metavar="FILE_OR_MODULE:NAME",
        help="compare your own model: a common.twin.Twin, e.g. examples/llama/twin.py:llama_tiny "
        "(instead of --spec; --set model.<hparam>=... reaches its hyperparameters)",
    )
    parser.add_argument(
        "--checkpoint",
        metavar="FORMAT:PATH",
        help="start every backend from these weights: "
        + "; ".join(
            f"{f.value}: {m}"
            for f, m in CHECKPOINT_FORMAT_MEANINGS.items()
            if f != CheckpointFormat.ORBAX
        ),
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="run directory (default runs/compare-<time>-<run id>); compare "
        "writes only into a new or empty directory or one of its own runs",
    )
    parser.add_argument(
        "--run-id",
        type=run_id_arg,
        help="this run's id (default: a random one), written into "
        "the report and every backend's record",
    )
    add_profile_flag(parser)
    add_no_hlo_flag(parser)
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the finished run an --out holds (only that run's files are removed)",
    )
    # one flag of each kind per backend, named after it
    for name, row in backends.registry().items():
        flag = row.flag
        parser.add_argument(
            f"--{flag}-python",
            default=sys.executable,
            help=f"interpreter of the {name} environment",
        )
        parser.add_argument(
            f"--{flag}-set",
            action="append",
            default=[],
            metavar="SECTION.FIELD=VALUE",
            help=f"override a spec field for the {name} side only (a deliberate difference)",
        )
        parser.add_argument(
            f"--{flag}-record",
            type=Path,
            metavar="DIR",
            help=f"compare this existing {name} run (a directory with record.json) instead of "
            "running it",
        )
        for option in row.passthrough:
            parser.add_argument(
                option.compare_flag,
                choices=option.choices,
                default=option.default,
                help=f"{option.help} (passed to {name} as {option.backend_flag})",
            )
    parser.add_argument(
        "--compile-cache",
        type=Path,
        default=default_cache_dir(),
        metavar="DIR",
        help="persistent compile caches of the backends (default: %(default)s)",
    )
    parser.add_argument(
        "--no-compile-cache",
        dest="compile_cache",
        action="store_const",
        const=None,
        help="compile everything afresh (no persistent cache read or written)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=1800.0,
        help="seconds per backend (and per preparation step of a twin) before it is killed",
    )
    add_judging_flags(parser)
    hosts.add_flags(parser)
    parser.add_argument(
        "--tensors",
        choices=TENSOR_MODES,
        help="full: every backend keeps its gradients and final parameters whole and they are "
        "judged "
        "element by element; summary: as statistics and a fixed sample of values, judged on the "
        "sample and by norms (common/files/tensor_summary.py), for models too large to keep "
        "whole; auto: summaries, and those that leave tolerance kept whole by a second run "
        "(default: auto above 20M parameters, else full)",
    )
    parser.add_argument(
        "--activations",
        action="store_true",
        help="compare every module's step-0 activations on every backend, even when parity passes "
        "(each run captures them; by default only where step 0 parts, by one more run that "
        "trains nothing)",
    )
    parser.add_argument(
        "--generate",
        type=bounded_int(0, MAX_NEW_TOKENS, "tokens"),
        default=0,
        metavar="N",
        help="also prove each side's decode path (the twin's `decode`): prefill prompts of "
        "different lengths, left-padded, and N greedy tokens from the start weights, every side "
        "fed the reference's tokens; each step's logits compared across sides and against the "
        "side's own forward (common/generation.py)",
    )
    parser.add_argument(
        "--check-determinism",
        action="store_true",
        help="run each backend twice and require bitwise-identical per-step losses",
    )
    parser.add_argument(
        "--require-same-device",
        action="store_true",
        help="fail as not comparable (exit 1) when the backends ran on different platforms or "
        "device "
        "kinds; without it their numerics are still judged, and their timings are marked as "
        "each one's own (compare/judge/devices.py)",
    )
    parser.add_argument("--quiet", action="store_true", help="no live progress and no tables")
    parser.add_argument("--json", action="store_true", help="print only the JSON report")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks")
    return parser


def parse_options(argv) -> CompareOptions:
    """The command line, read once into the run's options (compare/options.py)."""
    args = parse_args(argv)
    names = backends_of(args.backend)
    refuse_flags_of_absent_backends(args, names)
    try:
        return CompareOptions.of(args, names, reference_of(args.reference, names))
    except INPUT_ERRORS as e:
        fail(str(e), ExitCode.USAGE)


def refuse_flags_of_absent_backends(args, names: list[str]) -> None:
    """A one-sided flag (--<backend>-set, -record, -python) given for a backend this run does not
    run would be ignored: the run would not be the one asked for."""
    for name in backends.names():
        if name in names:
            continue
        flag = name.replace("_", "-")
        given = [
            f"--{flag}-{what}"
            for what in ("set", "record")
            if getattr(args, f"{name}_{what}", None)
        ]
        if given:
            fail(
                f"{given[0]} is given, but {name} does not run (--backend "
                f"{','.join(names)}): add {name} to --backend or drop the flag",
                ExitCode.USAGE,
            )


def both() -> list[str]:
    """`--backend both`, the default: one runtime of each family."""
    return [r.name for r in backends.registry().values() if r.in_both]


def backends_of(choice: str) -> list[str]:
    """`both`, `all`, or a comma list of backend names, in the order given (they run in that
    order)."""
    if choice in ("both", "all"):
        return both() if choice == "both" else backends.names()
    names = [n.strip() for n in choice.split(",") if n.strip()]
    unknown = [n for n in names if n not in backends.registry()]
    choices = f"use both, all, or a comma list of {', '.join(backends.names())}"
    if not names:
        fail(f"--backend {choice!r} names no backend; {choices}", ExitCode.USAGE)
    if unknown:
        fail(f"--backend {choice!r}: {unknown[0]!r} is not a backend; {choices}", ExitCode.USAGE)
    if len(set(names)) != len(names):
        fail(f"--backend {choice!r} names a backend twice; list each once", ExitCode.USAGE)
    return names


def reference_of(choice: str | None, names: list[str]) -> str:
    if choice is None:
        return backends.DEFAULT_REFERENCE if backends.DEFAULT_REFERENCE in names else names[0]
    if choice not in names:
        fail(
            f"--reference {choice!r} is not among the backends that run ({', '.join(names)}); "
            "pick one "
            "of them or add it to --backend",
            ExitCode.USAGE,
        )
    return choice


def check_inputs(opts: CompareOptions):
    """Everything that can be refused before a run directory exists: spec, per-side overrides,
    tolerance profile, reused records. Returns (the run's spec, tolerance policy, the options with
    each side's spec)."""
    try:
        spec = resolve_spec(opts.run)
        # every side's spec, derived once (a bad one-sided override fails before any backend runs)
        opts = opts.with_specs({n: side_spec(opts, n) for n in opts.names})
        policy = load_policy(opts.judging.profile, spec.train.dtype)
        opts.check_parity_mode(spec)
        opts.check_generate(spec)
        opts.check_tolerance_flags(spec)
        hosts.check(opts, spec)
        # a user's data file is read and checked once here, before any backend starts (a twin's own
        # batches are its code, run by its describe step, never in this process:
        # common/data/batches.py)
        if spec.data.path and spec.task != "custom":
            make_dataset(spec)
    except (*INPUT_ERRORS, ToleranceError) as e:
        fail(str(e), ExitCode.USAGE)
    for name, path in opts.reused.items():
        flag = f"--{name.replace('_', '-')}-record"
        try:
            record = read_record(path)
            check_belongs(record, path, None)
            if record.status == BackendStatus.OK and len(opts.names) > 1:
                read_tensors(path, record)
        except RecordError as e:
            fail(f"{flag}: {e}", ExitCode.USAGE)
        # a record must be what it claims, or the report compares a run with itself
        if record.backend != name:
            fail(
                f"{flag} {path} holds a {record.backend} run, not a {name} one; pass a {name} run "
                "directory "
                f"(or give it as --{record.backend.replace('_', '-')}-record)",
                ExitCode.USAGE,
            )
        ran_otherwise = ran_differences(record.spec, opts.spec_of(name))
        if not ran_otherwise and name in kernel_sides(opts):
            fail(
                f"{flag}: {name} runs the kernel {kernel_sides(opts)[name].kernel!r}, judged by "
                "floor runs made here from the same start (compare/judge/kernels.py): run "
                f"{name} here instead",
                ExitCode.USAGE,
            )
        # judged under settings it never ran with (another dtype's bounds, steps it lacks)
        if ran_otherwise:
            more = f" (and {len(ran_otherwise) - 1} more)" if len(ran_otherwise) > 1 else ""
            fail(
                f"{flag} {path} ran with {ran_otherwise[0]}{more}; a reused run is judged as it "
                "ran: pass the "
                f"flags it ran with (its {SPEC_FILE}) or run {name} here instead",
                ExitCode.USAGE,
            )
    return spec, policy, opts


# the folders of the runs compare makes besides the backends' own: the seeds', noise floors', op
# checks', behaviour-matched and kernel floor runs
EXTRA_RUN_DIRS = (SEEDS_DIR, FLOOR_DIR, OPS_DIR, MATCHED_DIR, KERNELS_DIR)


def run_entries(names: list[str]) -> list[str]:
    """Every top-level entry a compare run may write in its directory (what replacing it may
    remove)."""
    return [
        *names,
        *(f"{n}-repeat" for n in names),
        START_DIR,
        *EXTRA_RUN_DIRS,
        *REPORT_FILES,
        *PLOT_FILES,
    ]


def backend_folders(launched: list[str]) -> list[str]:
    """The top-level entries of a run directory in which the backends `launched` run (each its own
    folder, its repeat's, and the seeds', noise floor's, op checks', behaviour-matched and kernel
    floor runs' folders)."""
    return [*launched, *(f"{n}-repeat" for n in launched), *EXTRA_RUN_DIRS] if launched else []


def prepare(opts: CompareOptions, spec) -> Prepared:
    """A user twin or a torch / hf checkpoint: the sides described and matched, the common start
    made (compare/runs/prepare.py; no folder when the backends start as they are: built-in init,
    canonical checkpoint), and the described processes that go on to make their side's run."""
    try:
        return prepare_start(
            spec,
            opts.checkpoint,
            opts.describer("torch"),
            opts.describer("nnx"),
            opts.timeout_s,
            describing_runs(opts),
            model_variants(opts, spec),
            any(
                backends.info(n).family == "nnx" and opts.spec_of(n).train.dtype == "bfloat16"
                for n in opts.names
                if n not in opts.reused
            ),
        )
    except INPUT_ERRORS as e:
        fail(str(e), ExitCode.USAGE)


def claim_run_dir(opts: CompareOptions, prepared: Path | None):
    """The run directory, claimed for this run (compare/runs/rundir.py), with the prepared start
    moved in. Returns it and the options the backends run with (the prepared start in place of the
    user's inputs, every side's spec derived again from it)."""
    out = opts.output.out
    try:
        run_dir = claim(
            out,
            opts.output.run_id,
            run_entries(list(opts.names)),
            opts.output.overwrite,
            opts.paths_read(),
        )
        if prepared:
            shutil.move(prepared, out / START_DIR)
    except RunDirError as e:
        fail(str(e), ExitCode.USAGE)
    finally:
        if prepared and prepared.exists():
            shutil.rmtree(prepared, ignore_errors=True)
    if run_dir.replaced and run_dir.replaced.get("state") != "finished":
        print(
            f"warning: {out} held run {run_dir.replaced.get('run_id')} (pid "
            f"{run_dir.replaced.get('pid')}) "
            "that never finished (killed?); its files were replaced by this run",
            file=sys.stderr,
        )
    # the backends run the prepared spec (canonical tree filled in) from the common start
    if prepared:
        opts = opts.with_start(out / START_DIR / SPEC_FILE, out / START_DIR / INIT_FILE)
        try:
            opts = opts.with_specs({n: side_spec(opts, n) for n in opts.names})
        except INPUT_ERRORS as e:
            fail(str(e), ExitCode.USAGE)
    return run_dir, opts


def refuse_bad_paths(opts: CompareOptions) -> None:
    """The paths a run reads and writes, refused before any is resolved: a loop of symbolic links
    (no open can follow it), a path that is not UTF-8 (the toolkit writes paths into its JSON
    records; the current folder too, where the run directory goes by default)."""
    paths = {"--out": opts.output.out or None, **opts.paths_read()}
    for flag, path in paths.items():
        if path and symlink_loop(path):
            fail(
                f"{flag} {path}: a loop of symbolic links; point it at a real file or folder",
                ExitCode.USAGE,
            )
    here = {} if opts.output.out else {"the current folder": Path.cwd()}
    for flag, path in {**here, **paths}.items():
        shown = not_utf8(path) if path else None
        if shown:
            fail(
                f"{flag} {shown}: its path is not UTF-8, and the toolkit writes paths into its "
                "JSON records; rename the folder (or file), or move it where the path is UTF-8",
                ExitCode.USAGE,
            )


def main(argv=None) -> int:
    install_signal_handlers()
    entered = time.time()
    opts = parse_options(argv)
    try:
        check_environment()  # every variable the toolkit reads, once (common/environment.py)
    except INPUT_ERRORS as e:
        fail(str(e), ExitCode.USAGE)
    # a host that refuses the run tells host 0 why; the run's warm interpreters end with it
    with meeting.refusals_told(opts.hosts), WarmInterpreters() as warm:
        return compare(opts, entered, warm)


def report_checks(opts: CompareOptions, plan: Plan, outcome, seeds: list, policy: dict) -> list:
    """The checks the verdict rests on besides the runs and their parity ((name, callable returning
    a CheckResult) pairs, compare/judge/verdict.py)."""
    out, names, judging = plan.out, plan.names, opts.judging
    checks = [
        ("statistical", functools.partial(statistical_check, out, names, opts.reference, seeds))
    ] * bool(seeds)
    # the extra runs the verdict rests on: one that failed is said (filled as they run)
    checks.append(("extra_runs", functools.partial(extra_runs_check, outcome.extra_failed)))
    if judging.check_determinism:
        checks.append(
            ("determinism", functools.partial(determinism_check, outcome.runs, outcome.repeats))
        )
    if plan.op_checks:
        checks.append(("ops", functools.partial(ops_check, out, list(plan.op_checks))))
    if (out / START_DIR / STATE_LINKS).exists() and set(FAMILIES) <= {
        backends.info(n).family for n in names
    }:
        checks.append(
            ("start_state", functools.partial(start_state_check, out / START_DIR, judging.profile))
        )
    if opts.capture.generate:
        checks.append(
            (
                "generation",
                functools.partial(
                    generation_check,
                    out,
                    names,
                    opts.reference,
                    policy,
                    opts.output.run_id,
                    opts.capture.generate,
                    load_policy(judging.profile, "float32")
                    if opts.spec_of(opts.reference).train.dtype == "bfloat16"
                    and judging.bf16 == "noise-floor"
                    else None,
                ),
            )
        )
    sides = kernel_sides(opts)
    if sides:
        dtype = opts.spec_of(opts.reference).train.dtype
        kernels = functools.partial(
            kernel_check, out, sides, dtype, opts.output.run_id, policy, outcome.runs
        )
        checks.append(("kernels", kernels))
    return checks


def wall_times(entered: float, main_started: float, backends_done: float, warm) -> dict:
    """report.json's `wall_time`: compare's phases, from its first line, and how many of the run's
    processes started from a warm interpreter (compare/runs/warm.py; None: the run started none of
    its own)."""
    return {
        "processes": warm,
        "compare_imports_s": entered - STARTED_AT,
        "prepare_s": main_started - entered,
        "backends_s": backends_done - main_started,
        "report_s": time.time() - backends_done,
        "total_s": time.time() - STARTED_AT,
        "note": "compare's own interpreter start (before its first line) is not included",
    }


def statistical_seeds(spec, judging) -> list[int]:
    """The seeds the statistical mode runs (the run's own first), none in the other modes."""
    if judging.parity_mode != ParityMode.STATISTICAL:
        return []
    return [spec.train.seed + i for i in range(judging.seeds)]


def judged_with_extra_runs(
    opts: CompareOptions, plan: Plan, outcome, inputs: ReportInputs, checks: tuple, floored: list
) -> Judgement:
    """The run judged on its runs, then again after each extra run its judging asks for
    (compare/runs/extra_runs.py): every file read once (Evidence), the last judging the one the
    report is built from."""
    evidence = Evidence()

    def rejudge(interrupted: bool, judged_by: ReportInputs = inputs) -> Judgement:
        judged = judge(judged_by, outcome.runs, interrupted, checks, evidence)
        return mark_failed_captures(judged, outcome.capture_failed)

    judged = keep_whole(opts, plan, outcome, floored, rejudge(outcome.interrupted), rejudge)
    judged = locate_divergence(opts, plan, outcome, judged, rejudge)
    judged = choices_where_parted(opts, plan, outcome, judged, rejudge)
    judged = explain_by_behaviours(opts, plan, outcome, judged, rejudge)
    judged = locate_decode_divergence(opts, plan, outcome, judged, rejudge)
    judged = floor_where_needed(
        opts,
        plan,
        outcome,
        judged,
        lambda why: rejudge(
            False, dataclasses.replace(inputs, floor_policy="noise-floor", floor_why=why)
        ),
    )
    if outcome.interrupted and judged.status != ReportStatus.INTERRUPTED:
        # a signal during an extra run: the run was interrupted, whatever the runs before said
        judged = rejudge(True)
    return judged


def compare(opts: CompareOptions, entered: float, warm: WarmInterpreters) -> int:
    names = list(opts.names)
    refuse_bad_paths(opts)
    import_while_idle()  # the plots' import, while compare waits on its twin loader and backends
    spec, policy, opts = check_inputs(opts)
    run_id = opts.output.run_id or new_run_id()
    opts = opts.with_output(run_id=run_id, out=opts.output.out or default_out(run_id))
    out, reuse, judging = opts.output.out, opts.reused, opts.judging
    try:
        # before the preparation, which can take minutes
        check_out(out, opts.output.overwrite, backend_folders([n for n in names if n not in reuse]))
    except RunDirError as e:
        fail(str(e), ExitCode.USAGE)
    # before the prepared start stands in for the user's
    weights = weights_origin(spec, opts.checkpoint)
    warm.start(opts)  # every process of the run from here on a fork of its backend's interpreter
    prepared = prepare(opts, spec)
    try:
        run_dir, opts = claim_run_dir(opts, prepared.folder)
        tensors, opts = tensor_mode(opts)
        plan = Plan(
            names,
            {n: opts.side(n).python for n in names},
            {n: main_launch(opts, n) for n in names if n not in reuse},
            reuse,
            out,
            opts.timeout_s,
            judging.check_determinism,
            op_check_launches(opts),
            prepared.waiting,
        )
        meeting.meet(opts.hosts)  # every host ready before any backend starts
    except meeting.MeetingError as e:
        run_dir.finish("refused")
        for step in prepared.waiting.values():
            step.stop()
        fail(str(e), ExitCode.USAGE)
    except BaseException:  # no described process is left waiting for a run that never comes
        for step in prepared.waiting.values():
            step.stop()
        raise
    main_started = time.time()
    seeds = statistical_seeds(spec, judging)
    floors = floor_policy(spec.train.dtype, judging.bf16, judging.fp32)  # the spec's dtype's policy
    with LiveProgress(not (opts.output.quiet or opts.output.json), spec.train.steps) as live:
        outcome = run_all(plan, live)
        for seed in seeds[1:]:
            if outcome.interrupted:
                break
            outcome.interrupted = run_all(
                Plan(
                    names,
                    plan.pythons,
                    {n: seed_launch(opts, n, seed) for n in names},
                    {},
                    out / SEEDS_DIR / str(seed),
                    opts.timeout_s,
                    False,
                ),
                live,
            ).interrupted
        floored = run_noise_floors(opts, floors, plan, outcome, spec.train.dtype, live)
        generation_runs(opts, plan, outcome)
        kernel_runs(opts, plan, outcome)
    backends_done = time.time()
    # a host other than 0 of a multi-host run: host 0 writes the report
    if hosts.follows(opts.hosts):
        run_dir.finish("interrupted" if outcome.interrupted else "followed")
        return (
            ExitCode.INTERRUPTED
            if outcome.interrupted
            else hosts.followed(opts.hosts, outcome.runs)
        )
    inputs = ReportInputs(
        spec,
        policy,
        names,
        opts.reference,
        out,
        run_id,
        judging.profile,
        opts.capture.compile_cache,
        peak_cache_dir() if opts.capture.compile_cache else None,
        {n: [o.split("=")[0] for o in opts.side(n).sets] for n in names},
        judging.parity_mode,
        opts.output.debug,
        floors,
        judging.require_same_device,
        tensors,
        weights,
    )
    checks = report_checks(opts, plan, outcome, seeds, policy)
    report = report_of(judged_with_extra_runs(opts, plan, outcome, inputs, tuple(checks), floored))
    warm.release()  # every process of the run made
    report["run_id"], report["replaced_run"] = run_id, run_dir.replaced
    report["compare_peak_rss_mb"] = peak_rss_mb()  # compare's own process, its backends apart
    report["hosts"] = hosts.section(opts.hosts)
    report["wall_time"] = wall_times(entered, main_started, backends_done, warm.counts())
    write_report(report, out)
    run_dir.finish(report["status"])
    show(opts.output, report, outcome.runs)
    return report["exit_code"]


def exit_code_of(ending: SystemExit) -> int:
    """The code a SystemExit carries, as the interpreter ends with it (a message: printed, 1)."""
    if ending.code is None or isinstance(ending.code, int):
        return ending.code or 0
    print(ending.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    # Every ending through exit_process, without the interpreter's teardown: ~0.1 s of every run,
    # and the plots' import thread (a daemon) may be loading matplotlib's extensions as it tears
    # down (seen: exit -6, 'terminate called without an active exception', and exit -11, each after
    # compare's own error line).
    try:
        try:
            code = main()
        except KeyboardInterrupt:  # before the backends ran (they say their own)
            print(
                "error: interrupted by a signal; what compare had started is stopped",
                file=sys.stderr,
            )
            code = ExitCode.INTERRUPTED
        except Exception as e:  # a bug in compare itself: one line, the traceback with --debug
            if "--debug" in sys.argv:
                raise
            fail(
                f"internal error in compare: {type(e).__name__}: {e} (rerun with --debug for the "
                "traceback)",
                ExitCode.INTERNAL,
            )
    except SystemExit as ending:  # fail()'s (its line said) and argparse's
        code = exit_code_of(ending)
    exit_process(code)

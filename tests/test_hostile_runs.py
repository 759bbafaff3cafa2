"""Run directories as careless hands give them: compare deletes only what it wrote, one directory
holds one run, a killed compare leaves no process behind, and exit codes mean one thing.

Every case goes through the real `python -m compare` in a subprocess and checks the exit code, the
one `error:` line, and the state of every directory and process involved afterwards.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from compare.__main__ import run_entries
from compare.runs.rundir import LOCK, MARKER
from tests.helpers import PLAIN, REPO, process_env, run_cli
from tests.test_reliability import hanging_backend, one_line_error, processes_with, report_of


def compare(*args, env=None, cwd_prefix="", timeout=300):
    return run_cli("compare", "--quiet", *args, env=env, shell_prefix=cwd_prefix, timeout=timeout)


def snapshot(top: Path) -> dict[str, str]:
    """Every file below `top` (links and names included) with a hash of its bytes."""
    out = {}
    for root, _, names in os.walk(top):
        for name in names:
            path = Path(root) / name
            out[str(path.relative_to(top))] = (
                f"link:{os.readlink(path)}"
                if path.is_symlink()
                else hashlib.sha256(path.read_bytes()).hexdigest()
            )
    return out


def user_files(top: Path) -> dict[str, str]:
    """A directory of the user's own: files and a folder with names and contents the toolkit never
    writes."""
    before = snapshot(top) if top.exists() else {}
    (top / "notes").mkdir(parents=True, exist_ok=True)
    (top / "notes" / "todo.txt").write_text("port the rotary embedding\n")
    (top / "weights.pt").write_bytes(os.urandom(2048))
    (top / ".hidden").write_text("mine")
    return {k: v for k, v in snapshot(top).items() if k not in before}


def reuse_args(finished_run: Path) -> list[str]:
    """A compare that reuses the finished jax run: it writes a whole run directory without
    training."""
    return [
        "--backend",
        "jax",
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
        "--jax-record",
        str(finished_run / "jax"),
    ]


# 1: compare never writes in, nor removes, what is not its own
# ------------------------------------------------


@pytest.mark.parametrize(
    "where, why",
    [
        (lambda tmp: REPO, "is this toolkit's checkout"),
        (lambda tmp: REPO.parent, "is a parent of this toolkit's checkout"),
        (lambda tmp: Path("/"), "is the filesystem root"),
        (lambda tmp: tmp / "home", "is the home directory"),
        (lambda tmp: Path("."), "is the current directory"),
        (lambda tmp: Path(".."), "is a parent of the current directory"),
    ],
)
@pytest.mark.error_case("out-dangerous")
def test_a_dangerous_out_is_refused_and_nothing_is_written(where, why, tmp_path):
    home, work = tmp_path / "home", tmp_path / "home" / "code" / "work"
    work.mkdir(parents=True)
    mine = user_files(home)
    out = where(tmp_path)
    before = sorted(os.listdir(work / out))
    proc = compare(
        "--out",
        str(out),
        "--backend",
        "jax",
        "--spec",
        "mlp-tiny",
        env={"HOME": str(home)},
        cwd_prefix=f"cd {work}",
    )  # the user works in a folder of their own
    assert proc.returncode == 2, proc.stderr
    assert one_line_error(proc).startswith(
        f"error: --out {out}: {why}; give the run a directory of its own"
    )
    # nothing of a run appeared there (the folder itself may change meanwhile: a checkout under /tmp
    # has the other test processes' temporary files beside it)
    assert not (set(os.listdir(work / out)) - set(before)) & {*run_entries(["jax"]), LOCK, MARKER}
    assert snapshot(home) == mine


@pytest.mark.error_case("out-foreign-files")
def test_an_out_holding_files_of_the_user_is_refused_untouched(tmp_path):
    out = tmp_path / "project"
    mine = user_files(out)
    proc = compare("--out", str(out), "--backend", "jax", "--spec", "mlp-tiny")
    assert proc.returncode == 2
    assert one_line_error(proc) == (
        f"error: --out {out} holds files this toolkit did not write (.hidden, notes, "
        "weights.pt); pass a new or empty directory"
    )
    assert snapshot(out) == mine and not (out / MARKER).exists() and not (out / LOCK).exists()


@pytest.mark.error_case("out-finished")
def test_overwriting_a_run_removes_its_files_and_keeps_the_users(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    old_files = json.loads((run / MARKER).read_text())["files"]
    assert "jax/record.json" in old_files and "report.json" in old_files
    mine = user_files(run)  # beside the run's files, at the top and inside a backend's folder
    (run / "jax" / "my-analysis.ipynb").write_text("{}")
    mine["jax/my-analysis.ipynb"] = snapshot(run)["jax/my-analysis.ipynb"]

    refused = compare("--out", str(run), *reuse_args(finished_run))
    assert refused.returncode == 2
    assert one_line_error(refused) == (
        f"error: {run} already holds a finished run (report.json); pass "
        "--overwrite or another --out"
    )
    proc = compare("--out", str(run), "--overwrite", *reuse_args(finished_run))
    assert proc.returncode == 0, proc.stderr
    after = snapshot(run)
    assert {k: after[k] for k in mine} == mine  # every file of the user's, byte for byte
    # the earlier run's own backend files are gone
    assert not (run / "jax" / "record.json").exists()
    report = report_of(run)
    assert report["replaced_run"]["run_id"] == report_of(finished_run)["run_id"] != report["run_id"]
    assert report["replaced_run"]["state"] == "finished"


@pytest.mark.error_case("out-foreign-inside")
def test_overwrite_over_a_users_file_in_a_backends_place_is_refused_removing_nothing(
    finished_run, tmp_path
):
    """The backend would refuse its folder only after the earlier run was removed and the others had
    run: compare refuses first, and the earlier run stays whole."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "jax" / "notes").mkdir()
    (run / "jax" / "notes" / "mine.txt").write_text("mine")
    before = snapshot(run)
    proc = compare(
        "--out", str(run), "--overwrite", "--backend", "jax", "--spec", "mlp-tiny", "--steps", "3"
    )
    assert proc.returncode == 2
    assert one_line_error(proc) == (
        f"error: --out {run}: jax/notes/mine.txt inside the run's own folders are not "
        "this toolkit's; move them out of the run or pass another --out"
    )
    assert snapshot(run) == before  # the earlier run whole, the user's file untouched


@pytest.mark.error_case("out-input-inside")
def test_overwrite_refuses_to_remove_a_record_it_is_asked_to_read(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = snapshot(run)
    proc = compare(
        "--out",
        str(run),
        "--overwrite",
        "--backend",
        "jax",
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
        "--jax-record",
        str(run / "jax"),
    )
    assert proc.returncode == 2
    assert one_line_error(proc) == (
        f"error: --jax-record {run / 'jax'} is part of the run in {run} that this one "
        "would replace; copy it elsewhere first or pass another --out"
    )
    assert snapshot(run) == before


# 2: one run directory, one run
# ------------------------------------------------------------------------------


def wait_for(predicate, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def running_marker(out: Path) -> bool:
    try:
        return json.loads((out / MARKER).read_text()).get("state") == "running"
    except (OSError, ValueError):
        return False


@pytest.mark.slow
@pytest.mark.error_case("out-locked")
def test_a_second_compare_on_the_same_out_is_refused_while_the_first_finishes_intact(tmp_path):
    out = tmp_path / "shared"
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "compare",
            "--quiet",
            "--out",
            str(out),
            "--backend",
            "jax",
            "--spec",
            "mlp-tiny",
            "--steps",
            "3",
        ],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=process_env(),
    )
    wait_for(lambda: running_marker(out), what="the first run's marker")
    first_id = json.loads((out / MARKER).read_text())["run_id"]
    second = compare(
        "--out", str(out), "--overwrite", "--backend", "jax", "--spec", "mlp-tiny", "--steps", "3"
    )
    assert second.returncode == 2
    assert one_line_error(second) == (
        f"error: another compare (pid {first.pid}, run {first_id}) is writing to "
        f"{out}; wait for it to finish or pass another --out"
    )
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    report = report_of(out)
    assert report["run_id"] == first_id and report["verdict"] == "pass"
    record = json.loads((out / "jax" / "record.json").read_text())
    assert record["run_id"] == first_id and len(record["steps"]) == 3


@pytest.mark.error_case("compare-killed")
def test_sigkill_of_compare_leaves_no_backend_and_the_next_run_reports_it(finished_run, tmp_path):
    marker = f"xla-twins-kill-{os.getpid()}-{time.time_ns()}"
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "compare",
            "--quiet",
            "--out",
            str(out),
            "--spec",
            "mlp-tiny",
            "--jax-python",
            str(hanging_backend(tmp_path, marker)),
        ],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=process_env(**PLAIN),  # the fake backend itself, not a warm server of it
    )
    wait_for(lambda: processes_with(f"{marker}-child"), what="the fake backend's child")
    backend_pids = [p.pid for p in processes_with(marker) if p.pid != proc.pid]
    assert len(backend_pids) == 2  # the backend and its child, in the backend's own process group
    killed_id = json.loads((out / MARKER).read_text())["run_id"]
    proc.kill()
    proc.communicate(timeout=30)
    wait_for(
        lambda: (
            not any(
                psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                for p in backend_pids
            )
        ),
        timeout=15,
        what="the backend group to die with compare",
    )
    assert processes_with(marker) == []
    assert (out / "jax" / "stdout.log").exists()  # what the killed run left

    again = compare("--out", str(out), *reuse_args(finished_run))
    assert again.returncode == 0, again.stderr
    assert [ln for ln in again.stderr.splitlines() if ln.strip()] == [
        f"warning: {out} held run {killed_id} (pid {proc.pid}) that never finished (killed?); its "
        "files were "
        "replaced by this run"
    ]
    report = report_of(out)
    assert report["replaced_run"] == {
        **report["replaced_run"],
        "run_id": killed_id,
        "state": "running",
    }
    assert not (out / "jax").exists()  # nothing of the killed run is judged or kept


@pytest.mark.error_case("record-short")
def test_a_record_shorter_than_its_spec_is_refused(finished_run, tmp_path):
    record_dir = tmp_path / "jax"
    shutil.copytree(finished_run / "jax", record_dir)
    record = json.loads((record_dir / "record.json").read_text())
    record["steps"] = record["steps"][:2]
    (record_dir / "record.json").write_text(json.dumps(record))
    proc = compare(
        "--out",
        str(tmp_path / "again"),
        "--backend",
        "jax",
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
        "--jax-record",
        str(record_dir),
    )
    assert proc.returncode == 2
    assert one_line_error(proc) == (
        f"error: --jax-record: run record {record_dir} says ok but holds 2 of its 3 "
        "steps (truncated or edited)"
    )
    assert not (tmp_path / "again").exists()


def test_a_record_of_another_run_is_never_judged(finished_run):
    from common.files.record import RecordError, read_record
    from compare.reporting.report import check_belongs

    record = read_record(finished_run / "jax")
    check_belongs(record, finished_run / "jax", record.run_id)  # its own run: judged
    with pytest.raises(
        RecordError, match=f"belongs to run {record.run_id}, not to this run 0123456789ab: a stale"
    ):
        check_belongs(record, finished_run / "jax", "0123456789ab")


# 4: no silent pass, and one meaning per exit code
# -----------------------------------------------------------


@pytest.mark.error_case("determinism-reused")
def test_check_determinism_with_a_reused_record_is_refused(finished_run, tmp_path):
    proc = compare("--out", str(tmp_path / "d"), "--check-determinism", *reuse_args(finished_run))
    assert proc.returncode == 2
    assert one_line_error(proc) == (
        "error: --check-determinism runs each backend twice; it cannot reuse "
        "--jax-record (run that backend here instead)"
    )
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("fmt", ["--json", None])
@pytest.mark.error_case("stdout-closed")
def test_a_reader_that_stops_reading_changes_no_exit_code(finished_run, fmt, tmp_path):
    out = tmp_path / "piped"
    command = [
        sys.executable,
        "-m",
        "compare",
        *([fmt] if fmt else []),
        "--out",
        str(out),
        *reuse_args(finished_run),
    ]
    script = (
        " ".join(f"'{c}'" for c in command) + ' | head -c 1 >/dev/null; exit "${PIPESTATUS[0]}"'
    )
    proc = subprocess.run(
        ["bash", "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=process_env(COLUMNS="200"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr
    assert report_of(out)["verdict"] == "pass"


# 5: signals
# -------------------------------------------------------------------------------------------------


@pytest.mark.error_case("interrupt-inherited-ignored")
def test_sigint_is_honoured_when_the_shell_started_compare_with_it_ignored(tmp_path):
    """A non-interactive shell starts background jobs (`make test &`, CI) with SIGINT ignored, and
    Python then installs no KeyboardInterrupt: compare installs its own handler on its first
    line."""
    marker = f"xla-twins-ign-{os.getpid()}-{time.time_ns()}"
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "compare",
        "--quiet",
        "--out",
        str(out),
        "--spec",
        "mlp-tiny",
        "--jax-python",
        str(hanging_backend(tmp_path, marker)),
    ]
    proc = subprocess.Popen(
        ["sh", "-c", 'trap \'\' INT; exec "$0" "$@"', *command],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=process_env(**PLAIN),  # the fake backend itself, not a warm server of it
    )
    wait_for(lambda: processes_with(f"{marker}-child"), what="the fake backend's child")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 4, stderr
    assert report_of(out)["backends"]["jax"]["status"] == "interrupted"
    assert processes_with(marker) == []


# 7: argparse errors are one line
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "module, args, message",
    [
        (
            "compare",
            ["--seeds", "0"],
            "argument --seeds: '0' is not a whole number of seeds from 1 to 100",
        ),
        (
            "compare",
            ["--seeds", "100000"],
            "argument --seeds: '100000' is not a whole number of seeds from 1 to 100",
        ),
        (
            "compare",
            ["--timeout", "-5"],
            "argument --timeout: '-5' is not a positive number of seconds",
        ),
        (
            "compare",
            ["--timeout", "nan"],
            "argument --timeout: 'nan' is not a positive number of seconds",
        ),
        (
            "compare",
            ["--run-id", "../x"],
            "argument --run-id: use 1 to 64 letters, digits, '-', '_' or '.'",
        ),
        ("compare", ["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (
            "compare",
            ["--torch-xla-mode", "eager"],
            "argument --torch-xla-mode: invalid choice: 'eager'",
        ),
        ("compare", ["--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
        ("compare.convert", ["--to", "torch:x.pt"], "the following arguments are required: --from"),
        ("compare.hlo", [], "the following arguments are required"),
        pytest.param(
            "jax_impl",
            ["--steps", "many"],
            "argument --steps: 'many' is not a whole number of steps from 1 to 1000000000",
            marks=pytest.mark.slow,
        ),  # a backend process, however short
        pytest.param(
            "torch_xla_impl", ["--bogus"], "unrecognized arguments: --bogus", marks=pytest.mark.slow
        ),
    ],
)
@pytest.mark.error_case("argparse-one-line")
def test_a_command_line_error_is_one_line_with_the_help_hint(module, args, message, tmp_path):
    proc = (
        run_cli(module, *args, "--out", str(tmp_path / "o"))
        if module != "compare.hlo"
        else run_cli(module)
    )
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "usage:" not in proc.stderr, proc.stderr
    assert lines[0].startswith("error: ") and message in lines[0]
    assert lines[0].endswith(f"(see python -m {module} --help)")
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax_impl", "torch_impl"])
@pytest.mark.error_case("backend-out-foreign")
def test_a_backend_run_alone_never_writes_among_the_users_files(backend, tmp_path):
    out = tmp_path / "project"
    mine = user_files(out)
    proc = run_cli(backend, "--spec", "mlp-tiny", "--steps", "1", "--out", str(out))
    assert proc.returncode == 2
    assert one_line_error(proc) == (
        f"error: --out {out} holds files this toolkit did not write (no record.json); "
        "pass a new or empty directory"
    )
    proc = run_cli(
        backend, "--spec", "mlp-tiny", "--steps", "1", "--out", ".", shell_prefix=f"cd {out}"
    )
    assert proc.returncode == 2
    assert one_line_error(proc).startswith(
        "error: --out .: is the current directory; give the run a directory"
    )
    assert snapshot(out) == mine


@pytest.mark.slow
def test_a_directory_a_failed_run_left_is_the_backends_own(tmp_path):
    """A torch_xla run that crashed leaves its debug log and compare's logs, no record: the next run
    into that directory is not told it holds files this toolkit did not write; another backend
    is."""
    out = tmp_path / "run"
    out.mkdir()
    for name in ("xla_debug.log", "stderr.log", "stdout.log"):
        (out / name).write_text("a crashed run's log\n")
    refused = run_cli("jax_impl", "--spec", "mlp-tiny", "--steps", "1", "--out", str(out))
    assert refused.returncode == 2 and "holds files this toolkit did not write" in one_line_error(
        refused
    )
    # beside torch_xla's own logs, a file it did not write
    (out / "notes.txt").write_text("the user's own\n")
    refused = run_cli("torch_xla_impl", "--spec", "mlp-tiny", "--steps", "1", "--out", str(out))
    assert refused.returncode == 2 and "holds files this toolkit did not write" in one_line_error(
        refused
    )
    assert sorted(os.listdir(out)) == ["notes.txt", "stderr.log", "stdout.log", "xla_debug.log"]
    assert (out / "notes.txt").read_text() == "the user's own\n"
    assert (out / "xla_debug.log").read_text() == "a crashed run's log\n"
    (out / "notes.txt").unlink()
    # compare --processes' logs folder is the backend's own only while it
    # holds nothing but process logs
    (out / "processes").mkdir()
    (out / "processes" / "process-1.log").write_text("a crashed run's log\n")
    (out / "processes" / "thesis.tex").write_text("the user's own\n")
    refused = run_cli("torch_xla_impl", "--spec", "mlp-tiny", "--steps", "1", "--out", str(out))
    assert refused.returncode == 2 and "holds files this toolkit did not write" in one_line_error(
        refused
    )
    assert (out / "processes" / "thesis.tex").read_text() == "the user's own\n"
    (out / "processes" / "thesis.tex").unlink()
    # so is a multi-process run's shards folder (common/files/shards.py): a user's file in it makes
    # the directory foreign
    (out / "shards").mkdir()
    (out / "shards" / "process-1.npz").write_bytes(b"a crashed run's shards")
    (out / "shards" / "data.npz").write_bytes(b"the user's own")
    refused = run_cli("jax_impl", "--spec", "mlp-tiny", "--steps", "1", "--out", str(out))
    assert refused.returncode == 2 and "holds files this toolkit did not write" in one_line_error(
        refused
    )
    assert (out / "shards" / "data.npz").read_bytes() == b"the user's own"
    (out / "shards" / "data.npz").unlink()
    proc = run_cli(
        "torch_xla_impl",
        "--spec",
        "mlp-tiny",
        "--steps",
        "1",
        "--throughput-steps",
        "0",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "record.json").read_text())["status"] == "ok"


# the Python API (and so the pytest plugin)
# -------------------------------------------------------------------

LLAMA = str(REPO / "examples" / "llama" / "twin.py") + ":llama_tiny"


@pytest.mark.error_case("out-foreign-files")
def test_check_twin_into_a_folder_of_the_users_raises_and_touches_nothing(tmp_path):
    from compare.api import CompareError, check_twin

    out = tmp_path / "project"
    mine = user_files(out)
    with pytest.raises(CompareError, match="holds files this toolkit did not write") as refused:
        check_twin(LLAMA, out=out, steps=1)
    assert refused.value.exit_code == 2 and snapshot(out) == mine


def test_check_twin_never_returns_an_earlier_runs_report(finished_run, tmp_path):
    from compare.api import CompareError, check_twin

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)  # a finished run whose report.json says pass
    before = snapshot(out)
    with pytest.raises(CompareError, match="has no hyperparameter 'no_such'"):
        check_twin(LLAMA, out=out, sets=["model.no_such=1"])
    assert snapshot(out) == before

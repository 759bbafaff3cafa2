"""Bad input, crashes, hangs and interrupts: the real `compare` CLI in a subprocess, every case.

Each test checks the exit code, the one-line message on stderr (no traceback),
and what the run directory says. Fake backends are executables passed as
`--jax-python` / `--torch-xla-python`: they stand in for a broken interpreter,
never for a framework.
"""

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import REPO, process_env, run_cli


def compare(*args, timeout=600):
    return run_cli("compare", "--quiet", *args, timeout=timeout)


def one_line_error(proc) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert errors, proc.stderr
    return errors[-1]


def report_of(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def processes_with(marker: str) -> list:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def hanging_backend(tmp_path: Path, marker: str) -> Path:
    """An 'interpreter' that starts a child and never finishes (both carry `marker`)."""
    return executable(
        tmp_path / f"{marker}-python",
        f"""#!{sys.executable}
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}-child"])
print("progress step=0 loss=1.0 ms=1.0", flush=True)
time.sleep(600)
""",
    )


# 1-3: usage and spec errors
# -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--backend", "mxnet"],
            "--backend 'mxnet': 'mxnet' is not a backend; use both, all, or a comma list of jax, "
            "torch, torch_xla, torchax",
        ),
        (["--backend", "jax,torch,jax"], "--backend 'jax,torch,jax' names a backend twice"),
        (["--backend", " , "], "names no backend"),
        (
            ["--backend", "torch,torchax", "--reference", "jax"],
            "--reference 'jax' is not among the backends that run (torch, torchax)",
        ),
        (
            ["--backend", "jax,torch", "--torchax-set", "model.kernel=pallas"],
            "--torchax-set is given, but torchax does not run (--backend jax,torch): add torchax "
            "to --backend or drop the flag",
        ),
        (["--spec", "gpt-huge"], "unknown spec 'gpt-huge'"),
        (["--spec", "/nonexistent/run.toml"], "cannot read spec file /nonexistent/run.toml"),
        (["--set", "model.widht=3"], "unknown key model.widht"),
        (["--set", "train.steps=many"], "train.steps=many must be an integer"),
        (["--set", "model.d_model=0"], "model.d_model=0 must be positive"),
        (["--set", "model.n_heads=5"], "model.n_heads=5 does not divide model.d_model=64"),
        (
            ["--set", "data.seq_len=512"],
            "data.seq_len=512 is longer than the positional table model.seq_len=64",
        ),
        (["--set", "train.lr=-1"], "train.lr=-1.0 must be positive"),
        (["--set", "train.optimizer=lamb"], "train.optimizer=lamb is not one of adamw, sgd"),
        (
            ["--set", "train.dropout_masks=numpy"],
            "train.dropout_masks=numpy must be one of framework, common",
        ),
        (
            ["--mesh", "data=3"],
            "train.global_batch_size=16 is not divisible by the data-parallel size",
        ),
        (["--tolerance-profile", "lax"], "--tolerance-profile lax: not a profile"),
    ],
)
@pytest.mark.error_case(
    "backend-unknown",
    "backend-twice-or-none",
    "reference-not-run",
    "flag-of-absent-backend",
    "spec-unknown-preset",
    "spec-file-unreadable",
    "set-unknown-key",
    "set-wrong-type",
    "spec-invalid-value",
    "batch-not-divisible",
    "tolerance-profile-bad",
)
def test_bad_usage_is_exit_2_with_one_line_and_no_run_dir(args, message, tmp_path):
    out = tmp_path / "run"
    proc = compare("--out", str(out), *args)
    assert proc.returncode == 2
    assert message in one_line_error(proc)
    assert not out.exists()  # refused before anything started: nothing half-made


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch_xla", "torch", "torchax"])
@pytest.mark.error_case("data-file-bad")
def test_bad_data_is_refused_before_any_backend_the_same_everywhere(backend, tmp_path):
    import numpy as np

    tokens = tmp_path / "train.bin"
    # nanoGPT-style ids; 256 and up exceed gpt-tiny's vocab
    np.arange(1000, dtype=np.uint16).tofile(tokens)
    message = f"{tokens}: token id 256 at position 256 is outside model.vocab_size=256"
    args = ("--set", "data.dataset=tokens-file", "--set", f"data.path={tokens}", "--steps", "2")
    proc = compare("--out", str(tmp_path / "run"), "--backend", backend, *args)
    assert proc.returncode == 2 and message in one_line_error(proc)
    assert not (tmp_path / "run").exists()
    module = {
        "jax": "jax_impl",
        "torch_xla": "torch_xla_impl",
        "torch": "torch_impl",
        "torchax": "torchax_impl",
    }
    # the backend alone says the same
    alone = run_cli(module[backend], *args, "--out", str(tmp_path / "alone"))
    assert alone.returncode == 2 and message in one_line_error(alone)


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend, env",
    [("jax_impl", {"JAX_NUM_CPU_DEVICES": "1"}), ("torch_xla_impl", {"CPU_NUM_DEVICES": "1"})],
)
@pytest.mark.error_case("mesh-exceeds-devices")
def test_a_mesh_larger_than_the_platform_is_refused(backend, env, tmp_path):
    # The backends create the CPU devices a mesh needs unless the user fixed the count, as here.
    proc = run_cli(
        backend, "--spec", "mlp-tiny", "--mesh", "data=2", "--out", str(tmp_path / "run"), env=env
    )
    assert proc.returncode == 2
    assert "mesh data=2,fsdp=1,tensor=1 needs 2 devices; this platform has 1" in one_line_error(
        proc
    )


# 4: a framework missing from the interpreter given
# ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend, extra", [("torch_xla", "torch-xla"), ("torchax", "torchax"), ("torch", "torch-xla")]
)
@pytest.mark.error_case("framework-missing")
def test_a_framework_missing_from_the_given_interpreter(backend, extra, finished_run, tmp_path):
    base = Path(sys.base_prefix) / "bin" / "python3"
    probe = subprocess.run(
        [
            str(base),
            "-c",
            "import numpy, importlib.util as u; "
            "print(u.find_spec('torch') is None and u.find_spec('jax') is None)",
        ],
        capture_output=True,
        text=True,
    )
    if probe.stdout.strip() != "True":
        pytest.skip("needs a base interpreter with numpy and without torch and jax")
    out = tmp_path / "run"
    flag = backend.replace("_", "-")
    proc = compare(
        "--out",
        str(out),
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
        "--backend",
        f"jax,{backend}",
        f"--{flag}-python",
        str(base),
        "--jax-record",
        str(finished_run / "jax"),
    )
    assert proc.returncode == 2
    report = report_of(out)
    entry = report["backends"][backend]
    assert entry["status"] == "usage_error"
    assert f"the {backend} backend needs torch, which is not installed in" in entry["message"]
    assert (
        f"pip install -e '.[{extra}]'" in entry["message"]
        and f"--{flag}-python" in entry["message"]
    )
    # the other side is still judged and reported
    assert report["backends"]["jax"]["status"] == "ok"


# 5: corrupt inputs handed to compare
# ------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda d: (d / "record.json").write_text((d / "record.json").read_text()[:200]),
            "is not valid JSON",
        ),
        (
            lambda d: (d / "record.json").write_text(
                json.dumps({**json.loads((d / "record.json").read_text()), "schema_version": 0})
            ),
            "has schema_version 0",
        ),
        (
            lambda d: (d / "tensors.npz").write_bytes((d / "tensors.npz").read_bytes()[:500]),
            "corrupt or truncated",
        ),
    ],
)
@pytest.mark.error_case("record-corrupt")
def test_corrupt_records_are_refused(finished_run, damage, message, tmp_path):
    import shutil

    record_dir = tmp_path / "jax"
    shutil.copytree(finished_run / "jax", record_dir)
    damage(record_dir)
    proc = compare(
        "--out",
        str(tmp_path / "again"),
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
        "--jax-record",
        str(record_dir),
        "--torch-xla-record",
        str(record_dir),
    )
    assert proc.returncode == 2
    line = one_line_error(proc)
    assert "--jax-record" in line and message in line
    assert not (tmp_path / "again").exists()


@pytest.mark.parametrize("flag", ["--torch-xla-record", "--torchax-record"])
@pytest.mark.error_case("record-other-backend")
def test_a_record_of_another_backend_is_refused(finished_run, flag, tmp_path):
    backend = flag.removeprefix("--").removesuffix("-record").replace("-", "_")
    proc = compare(
        "--out",
        str(tmp_path / "again"),
        "--backend",
        f"jax,{backend}",
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
        flag,
        str(finished_run / "jax"),
    )
    assert proc.returncode == 2
    assert one_line_error(proc) == (
        f"error: {flag} {finished_run / 'jax'} holds a jax run, not a {backend} one; "
        f"pass a {backend} run directory (or give it as --jax-record)"
    )
    assert not (tmp_path / "again").exists()


def test_an_existing_record_can_be_compared_again(finished_run, tmp_path):
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
        str(finished_run / "jax"),
    )
    assert proc.returncode == 0, proc.stderr
    report = report_of(tmp_path / "again")
    assert report["backends"]["jax"]["reused_record"] is True
    assert (
        report["backends"]["jax"]["losses"] == report_of(finished_run)["backends"]["jax"]["losses"]
    )


@pytest.mark.slow
@pytest.mark.error_case("checkpoint-canonical-misfit")
def test_a_checkpoint_that_does_not_fit_names_the_tensor(tmp_path):
    sys.path.insert(0, str(REPO))
    import numpy as np

    from common.presets import load_spec
    from common.weights import init_params, save_checkpoint

    params = init_params(load_spec("mlp-tiny").model, 0)
    params["hidden.0.kernel"] = np.zeros((784, 255), np.float32)
    save_checkpoint(tmp_path / "bad.safetensors", params)
    proc = run_cli(
        "jax_impl",
        "--spec",
        "mlp-tiny",
        "--checkpoint",
        str(tmp_path / "bad.safetensors"),
        "--out",
        str(tmp_path / "run"),
    )
    assert proc.returncode == 2
    assert (
        "tensor hidden.0.kernel has shape (784, 255), the spec needs (784, 256)"
        in one_line_error(proc)
    )


# 6: non-finite loss
# -------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.error_case("nonfinite")
def test_a_nan_loss_stops_the_backend_and_is_reported_with_its_step(tmp_path):
    out = tmp_path / "run"
    # the stop and its cause are common code (common/files/record.py, driver/backend_main.py): two
    # runtimes show it
    proc = compare(
        "--out",
        str(out),
        "--backend",
        "jax,torch",
        "--spec",
        "mlp-tiny",
        "--steps",
        "8",
        "--set",
        "train.lr=1e6",
        "--set",
        "train.grad_clip=0",
    )
    assert proc.returncode == 3
    report = report_of(out)
    assert report["status"] == "backend_failed"
    for name in ("jax", "torch"):
        entry = report["backends"][name]
        match = re.search(r"loss is (nan|inf|-inf) at step (\d+)", entry["message"])
        assert entry["status"] == "nonfinite" and match, entry["message"]
        step = int(match.group(2))
        # stopped at that step
        assert len(entry["losses"]) == step + 1 and entry["losses"][-1] is None
        assert "likely cause: the loss was diverging (2.377 at step 0 -> " in entry["message"]
        assert entry["message"].endswith(
            "lower train.lr (now 1e+06) and turn gradient clipping on (train.grad_clip=1.0)"
        )


# 7: crash and hang
# ----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.error_case("backend-timeout")
def test_a_hanging_backend_is_killed_with_its_children_and_the_other_still_runs(tmp_path):
    marker = f"xla-twins-hang-{os.getpid()}-{time.time_ns()}"
    out = tmp_path / "run"
    start = time.monotonic()
    proc = compare(
        "--out",
        str(out),
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
        "--timeout",
        "12",
        "--backend",
        "jax,torch",
        "--jax-python",
        str(hanging_backend(tmp_path, marker)),
    )
    assert proc.returncode == 3
    report = report_of(out)
    assert report["backends"]["jax"]["status"] == "timeout"
    assert "killed with its process group" in report["backends"]["jax"]["message"]
    assert report["backends"]["torch"]["status"] == "ok"
    assert time.monotonic() - start < 300
    assert processes_with(marker) == []  # the backend's child went down with it


# 8: interrupts
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.error_case("interrupted")
def test_an_interrupt_terminates_children_and_marks_the_run(sig, tmp_path):
    marker = f"xla-twins-int-{os.getpid()}-{time.time_ns()}"
    out = tmp_path / "run"
    cmd = [
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
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=process_env()
    )
    deadline = time.monotonic() + 60
    while not processes_with(f"{marker}-child") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(f"{marker}-child"), "the fake backend never started"
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 4, stderr
    assert "Traceback" not in stderr
    report = report_of(out)
    assert report["status"] == "interrupted" and report["exit_code"] == 4
    assert report["backends"]["jax"]["status"] == "interrupted"
    assert report["backends"]["torch_xla"]["status"] == "not_run"
    assert processes_with(marker) == []


# 9: output directory
# ------------------------------------------------------------------------------------------


@pytest.mark.error_case("out-not-writable")
def test_an_output_directory_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = compare("--out", str(blocker / "run"), "--spec", "mlp-tiny")
    assert proc.returncode == 2
    assert f"run directory {blocker / 'run'} is not writable" in one_line_error(proc)


@pytest.mark.error_case("report-disk-full")
def test_a_disk_that_fills_while_compare_writes_its_report_is_exit_7_with_nothing_half_written(
    finished_run, tmp_path
):
    # any file compare writes past 8 KiB fails with EFBIG, as a full disk with ENOSPC
    out = tmp_path / "again"
    proc = run_cli(
        "compare",
        "--out",
        str(out),
        "--backend",
        "jax",
        "--jax-record",
        str(finished_run / "jax"),
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
        "--quiet",
        shell_prefix="trap '' XFSZ; ulimit -f 16",
    )
    assert proc.returncode == 7
    assert one_line_error(proc) == (
        f"error: cannot write the report to {out}: File too large (disk full, or the "
        "directory became unwritable); free space or pass another --out"
    )
    # no plot, report or temporary file (the plots are written atomically too); only the run's
    # marker and lock
    assert {p.name for p in out.iterdir()} == {".xla-twins-run.json", ".xla-twins-run.lock"}


@pytest.mark.error_case("out-finished")
def test_a_finished_run_is_not_overwritten_without_asking(finished_run):
    before = (finished_run / "report.json").read_text()
    proc = compare(
        "--out", str(finished_run), "--backend", "jax", "--spec", "mlp-tiny", "--steps", "3"
    )
    assert proc.returncode == 2
    assert "already holds a finished run (report.json); pass --overwrite" in one_line_error(proc)
    assert (finished_run / "report.json").read_text() == before


# determinism
# --------------------------------------------------------------------------------------------------

# --check-determinism on both backends: tests/test_compile_cache.py's cold run


# 9: faults: a backend killed from outside, a disk that fills
# -----------------------------------------------


def _wrapped_backend(tmp_path: Path, name: str, prelude: str) -> Path:
    """An 'interpreter' that runs the real backend (`-m module args`) in-process after `prelude`."""
    return executable(
        tmp_path / f"{name}-python",
        f"""#!{sys.executable}
import os, resource, runpy, signal, sys
sys.path.insert(0, {str(REPO)!r})
{prelude}
module = sys.argv[2]
sys.argv = [module] + sys.argv[3:]
runpy.run_module(module, run_name="__main__")
""",
    )


def _no_partial_files(run_dir: Path) -> list[str]:
    return [
        p.name
        for p in run_dir.rglob("*")
        if p.name.endswith(".tmp") or p.name in ("record.json", "tensors.npz")
    ]


@pytest.mark.slow
@pytest.mark.error_case("backend-killed")
def test_a_backend_killed_mid_run_leaves_nothing_half_written_and_the_others_are_judged(tmp_path):
    killer = _wrapped_backend(
        tmp_path,
        "killed",
        """
import driver.backend_main as bm
show = bm.progress_printer(True)
def killing(enabled):
    def step(i, loss, ms):
        show(i, loss, ms)
        if i == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    return step
bm.progress_printer = killing
""",
    )
    out = tmp_path / "run"
    proc = compare(
        "--out",
        str(out),
        "--backend",
        "jax,torch,torchax",
        "--spec",
        "mlp-tiny",
        "--steps",
        "6",
        "--torch-python",
        str(killer),
    )
    assert proc.returncode == 3
    report = report_of(out)
    assert report["backends"]["torch"]["status"] == "failed"
    assert report["backends"]["torch"]["message"].startswith("killed by SIGKILL")
    assert _no_partial_files(out / "torch") == []
    assert report["backends"]["torchax"]["status"] == "ok" and report["parity"]["torchax"]["passed"]
    assert "torch: failed: killed by SIGKILL" in report["message"]


@pytest.mark.slow
@pytest.mark.error_case("backend-disk-full")
def test_a_disk_that_fills_while_a_backend_writes_is_an_io_error_with_nothing_half_written(
    tmp_path,
):
    # RLIMIT_FSIZE: any file this backend writes past 64 KiB fails with EFBIG ("File too large"), as
    # a full disk fails with ENOSPC; compare's own files (logs, report)
    # are written by compare, unlimited
    full = _wrapped_backend(
        tmp_path,
        "full",
        """
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
""",
    )
    out = tmp_path / "run"
    proc = compare(
        "--out",
        str(out),
        "--backend",
        "jax,torch",
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
        "--jax-python",
        str(full),
    )
    assert proc.returncode == 3
    report = report_of(out)
    jax = report["backends"]["jax"]
    assert jax["status"] == "io_error" and jax["exit_code"] == 7
    assert jax["message"] == (
        f"cannot write the results to {out / 'jax'}: File too large (disk full, or the "
        "directory became unwritable); free space or pass another --out"
    )
    assert _no_partial_files(out / "jax") == []
    assert report["backends"]["torch"]["status"] == "ok"

"""compare --processes N (compare/runs/processes.py): which backends and meshes it runs, and a
launcher that never leaves a process waiting on a failed one. The run itself:
tests/test_jax_backend.py (jax, eager torch and torchax as two processes)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from common import backends
from tests.helpers import REPO, judged_of, run_cli
from tests.test_preload import _running, server, started  # noqa: F401  (server: a fixture)


@pytest.mark.error_case("processes-one-process", "processes-mesh")
def test_processes_are_refused_where_a_backend_or_the_mesh_cannot_split(tmp_path):
    """--processes N: only backends whose row says they run as several processes, on a mesh N
    divides (a per-rank twin's torch side: one process per device); refused before anything runs
    (tests/test_jax_backend.py runs jax and torchax as two processes)."""
    assert [n for n in backends.names() if backends.info(n).processes] == [
        "jax",
        "torch",
        "torchax",
    ]
    for processes, args, message in (
        (
            "2",
            ["--backend", "jax,torch_xla", "--mesh", "data=2"],
            (
                "error: --processes 2: the torch_xla backend runs as one process (runs as "
                "several: jax, torch, "
                "torchax); drop --processes or leave torch_xla out of --backend"
            ),
        ),
        (
            "2",
            ["--twin", "examples/tensor_parallel/twin.py:tp_decoder", "--backend", "jax,torch"],
            (
                "error: --processes 2: eager torch runs a twin's per-rank torch side (its NNX "
                "side takes the mesh, nnx_mesh_arg) as one rank per device of the mesh tp: give "
                "--processes 4, or none (every rank on one process)"
            ),
        ),
        (
            "4",
            ["--backend", "jax", "--mesh", "data=2"],
            (
                "error: --processes 4: the mesh's 2 device(s) cannot be split evenly over 4 "
                "processes; give a --mesh "
                "whose device count they divide, e.g. --mesh data=4"
            ),
        ),
    ):
        proc = run_cli("compare", "--processes", processes, *args, "--out", str(tmp_path / "x"))
        assert proc.returncode == 2 and proc.stderr.strip() == message, proc.stderr
        assert not (tmp_path / "x").exists()


@pytest.mark.error_case("hosts-bad")
@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--num-hosts", "2"],
            "--num-hosts 2: give every host --coordinator HOST:PORT, host 0's address",
        ),
        (
            ["--num-hosts", "2", "--host-id", "2", "--coordinator", "127.0.0.1:12355"],
            "--host-id 2: a run of --num-hosts 2 has hosts 0 to 1",
        ),
        (
            ["--coordinator", "nope"],
            "--coordinator nope: give it as HOST:PORT, e.g. 10.0.0.2:12355",
        ),
        (
            ["--coordinator", ":12355"],
            "--coordinator :12355: give it as HOST:PORT, e.g. 10.0.0.2:12355",
        ),
        (
            ["--coordinator", "10.0.0.2:"],
            "--coordinator 10.0.0.2:: give it as HOST:PORT, e.g. 10.0.0.2:12355",
        ),
        (
            ["--num-hosts", "2", "--coordinator", "127.0.0.1:0"],
            "--coordinator 127.0.0.1:0: port 0 is not one to count "
            "up from (a run takes the ports from PORT up, one per launch); give a port from 1024 "
            "to 65279",
        ),
        (
            ["--num-hosts", "2", "--coordinator", "127.0.0.1:99999"],
            "--coordinator 127.0.0.1:99999: port 99999 is not "
            "one to count up from (a run takes the ports from PORT up, one per launch); give a "
            "port from 1024 to 65279",
        ),
        # the default mesh: one device
        (
            ["--num-hosts", "2", "--coordinator", "127.0.0.1:12355", "--backend", "jax"],
            "--processes 1 on 2 hosts: the mesh's 1 device(s) cannot be split evenly over 2 "
            "processes; give a --mesh "
            "whose device count they divide, e.g. --mesh data=2",
        ),
    ],
)
def test_a_multi_host_run_is_refused_when_its_hosts_cannot_meet(args, message, tmp_path):
    # a refusing host other than 0 tries to tell host 0 why (compare/runs/meeting.py), here for 1 s
    # of the default 30: no host 0 listens
    wait = {"XLA_TWINS_COORDINATOR_WAIT_S": "1"}
    proc = run_cli("compare", *args, "--out", str(tmp_path / "x"), env=wait)
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: {message}", proc.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.error_case("processes-one-fails")
def test_a_process_that_fails_stops_the_others_and_says_why(tmp_path):
    """Process 1 fails while process 0 would wait on it (in a collective, on a real run) for a
    minute: the launcher stops process 0, exits with process 1's code and says its error line."""
    fake = tmp_path / "backend.py"
    fake.write_text(
        textwrap.dedent("""
        import sys, time
        rank = int(sys.argv[sys.argv.index("--process-id") + 1])
        if rank == 1:
            sys.exit("error: shard 1 is missing")
        time.sleep(60)
    """)
    )
    (tmp_path / "logs").mkdir()
    start = time.monotonic()
    proc = run_cli(
        "compare.runs.processes",
        "--processes",
        "2",
        "--coordinator",
        "127.0.0.1:1",
        "--logs",
        str(tmp_path / "logs"),
        "--",
        sys.executable,
        str(fake),
    )
    assert proc.returncode == 1 and time.monotonic() - start < 30
    assert proc.stderr.strip() == "error: process 1 of 2 exited with code 1: shard 1 is missing"
    assert (tmp_path / "logs" / "process-1.log").read_text().strip() == "error: shard 1 is missing"

    # process 1 leaves early with 0 (sys.exit(0) in the user's forward); process 2, waiting on it in
    # a collective, fails after: the one that left is named, not the one that noticed
    fake.write_text(
        textwrap.dedent("""
        import sys, time
        rank = int(sys.argv[sys.argv.index("--process-id") + 1])
        if rank == 1:
            sys.exit(0)
        time.sleep(1.0 if rank == 2 else 60)
        sys.exit("error: Connection closed by peer")
    """)
    )
    proc = run_cli(
        "compare.runs.processes",
        *("--processes", "3", "--coordinator", "127.0.0.1:1", "--logs", str(tmp_path / "logs")),
        *("--", sys.executable, str(fake)),
    )
    assert proc.returncode == 1
    said = proc.stderr.strip()
    assert said.startswith("error: process 1 of 3 ended with code 0 ") and "\n" not in said
    assert "before process 2 failed with code 1 (Connection closed by peer), while the others " in (
        said
    )
    assert said.endswith(
        f"leaves the others waiting on it (its output: {tmp_path}/logs/process-1.log)"
    )


@pytest.mark.error_case("processes-torch-inexact")
def test_eager_torch_refuses_processes_where_averaged_gradients_are_not_the_batchs():
    """Eager torch as several processes averages each process's gradient over its rows
    (torch_impl/distributed.py): the whole batch's gradient only for a mean loss over rows on a
    model that mixes no rows; anything else is refused in one line before the process group
    starts."""
    from collections import OrderedDict

    import torch

    from common.presets import load_spec
    from common.spec import SpecError
    from torch_impl.distributed import refuse_batch_norm, refuse_inexact

    # the task's cross-entropy, torch's own dropout: accepted
    refuse_inexact(load_spec("gpt-tiny"), 2, 2)
    regressor = load_spec("", twin=f"{REPO}/tests/data/regression/twins.py:regressor")
    for spec, message in (
        (
            regressor,
            "eager torch on 2 processes averages each process's gradient over its share of the "
            "batch, "
            "which equals the whole batch's only for a mean over rows; the twin's own loss "
            "(torch_regressor.py:smooth_l1) may not be one",
        ),
        (
            load_spec("gpt-tiny", ["model.dropout=0.1", "train.dropout_masks=common"]),
            "common's exact dropout masks are drawn for the whole batch",
        ),
        (
            load_spec("gpt-tiny", ["train.global_batch_size=6"]),
            "train.global_batch_size=6 does not split evenly over 4 processes",
        ),
    ):
        with pytest.raises(SpecError) as caught:
            processes = 4 if "global_batch_size=6" in message else 2
            refuse_inexact(spec, processes, processes)
        assert message in str(caught.value), str(caught.value)
    stem = torch.nn.Sequential(
        OrderedDict(conv1=torch.nn.Conv2d(3, 4, 3), bn1=torch.nn.BatchNorm2d(4))
    )
    refuse_batch_norm(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2)), 2)
    with pytest.raises(SpecError) as caught:
        refuse_batch_norm(stem, 2)
    assert str(caught.value) == (
        "eager torch on 2 processes: module bn1 is BatchNorm2d, whose train-mode statistics would "
        "be each process's "
        "rows, not the whole batch's (torch.nn.SyncBatchNorm runs only on GPUs); compare torch in "
        "a run without "
        "--processes (or leave it out of --backend in this one)"
    )


@pytest.mark.slow
def test_eager_torch_captures_on_one_device_whatever_the_mesh(tmp_path):
    """The capture compare runs where a pair parts at step 0 (one process, one example, from the
    start weights) is the same on one device: eager torch takes it with the run's mesh instead of
    refusing the mesh, so a pair run with --processes is located like any other; a capture that
    fails anyway says so in the report."""
    from common.files.record import read_record
    from common.files.tensor_file import read_tensors
    from compare.runs.extra_runs import failed_captures, mark_failed_captures
    from compare.runs.orchestrate import BackendRun

    proc = run_cli(
        "torch_impl",
        "--spec",
        "gpt-tiny",
        "--mesh",
        "data=4",
        "--activations-only",
        "--out",
        str(tmp_path / "capture"),
    )
    assert proc.returncode == 0, proc.stderr
    captured = read_tensors(tmp_path / "capture", read_record(tmp_path / "capture"))["activations"]
    assert captured["blocks.1.mlp.fc"].shape == (1, 64, 256)
    # training: refused
    proc = run_cli("torch_impl", "--spec", "gpt-tiny", "--mesh", "data=4", "--steps", "1")
    assert (
        proc.returncode == 2
        and "run it data parallel as processes (compare --processes N)" in proc.stderr
    )
    failed = BackendRun("torch", tmp_path, "usage_error", 2, "boom", 1.0, [])
    judged = mark_failed_captures(
        judged_of({"torch": {"first_divergent_module": None}}), failed_captures({"torch": failed})
    )
    assert judged.parity["torch"]["capture_failed"] == "torch's capture run usage_error: boom"


@pytest.mark.usefixtures("server")  # in tmp_path
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_served_processes_end_with_their_launcher_however_it_ends(tmp_path, sig):
    """Each process a fork of its backend's warm interpreter (here a server of `-c`), in a session
    of its own, which compare's kill of the launcher's group does not reach: on SIGTERM (compare's
    kill) the launcher stops them; on SIGKILL (after the grace, or compare's guard) the server kills
    each one whose launcher is gone."""
    import psutil

    code = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "compare.runs.processes", "--processes", "2"]
        + ["--coordinator", "127.0.0.1:1", "--logs", str(tmp_path), "--"]
        + [sys.executable, "-c", code],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pids = [int(launcher.stdout.readline())]
    log = tmp_path / "process-1.log"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (log.exists() and log.read_text().endswith("\n")):
        time.sleep(0.05)
    pids.append(int(log.read_text()))
    assert all(os.getpgid(pid) == pid != launcher.pid for pid in pids)  # sessions of their own
    procs = [psutil.Process(pid) for pid in pids]  # held while they run: they may end at once
    launcher.send_signal(sig)
    assert launcher.wait(timeout=30) == (128 + sig if sig == signal.SIGTERM else -sig)
    while time.monotonic() < deadline + 30 and any(_running(p) for p in procs):
        time.sleep(0.1)
    assert not any(_running(p) for p in procs)
    assert started(tmp_path) == ["served -c", "served -c"]

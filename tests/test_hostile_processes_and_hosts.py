"""Hostile input on processes, hosts, timeouts and outputs (symbolic-link loops, a backend killed at
its timeout, an unwritable stdout, undecodable output, unreachable coordinators, hosts that never
come or disagree): one line naming it, its own exit code, and nothing of the user's touched."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from compare.runs.rundir import MARKER
from tests.helpers import REPO, process_env, run_cli


@pytest.mark.error_case("path-symlink-loop")
@pytest.mark.parametrize(
    "flag, ref",
    [
        ("--out", "{loop}"),
        ("--twin", "{loop}.py:twin"),
        ("--jax-record", "{loop}"),
        ("--checkpoint", "canonical:{loop}"),
        ("--spec", "{loop}.toml"),
        ("--tolerance-profile", "{loop}.toml"),
    ],
)
def test_a_symlink_loop_given_as_a_path_is_a_usage_error(tmp_path, flag, ref):
    loop = tmp_path / "a"
    for name, target in (
        ("a", "b"),
        ("b", "a"),
        ("a.py", "b.py"),
        ("b.py", "a.py"),
        ("a.toml", "b.toml"),
        ("b.toml", "a.toml"),
    ):
        os.symlink(target, tmp_path / name)
    links = {p.name: os.readlink(p) for p in tmp_path.iterdir()}
    value = ref.format(loop=loop)
    proc = run_cli("compare", "--quiet", "--backend", "jax", "--steps", "1", flag, value)
    shown = (
        value.partition(":")[2]
        if flag == "--checkpoint"
        else value.rpartition(":")[0]
        if flag == "--twin"
        else value
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr.strip()
        == f"error: {flag} {shown}: a loop of symbolic links; point it at a real file or folder"
    )
    # nothing made, nothing followed
    assert {p.name: os.readlink(p) for p in tmp_path.iterdir()} == links


@pytest.mark.slow
def test_a_torch_backend_killed_at_its_timeout_leaves_nothing_in_tmpdir(tmp_path):
    """torch's imports make a folder in TMPDIR that only a normal exit removes: each process group
    compare starts has a TMPDIR of its own, removed once the group is gone, however it ended
    (common/procs.py)."""
    (tmp_path / "tmp").mkdir()
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(tmp_path / "run"),
        "--backend",
        "torch",
        "--spec",
        "gpt-tiny",
        "--steps",
        "5000",
        "--timeout",
        "15",
        env={"TMPDIR": str(tmp_path / "tmp")},
    )
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert proc.returncode == 3 and report["backends"]["torch"]["status"] == "timeout", proc.stderr[
        -2000:
    ]
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.error_case("stdout-full")
@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["tables", "json"])
def test_a_stdout_that_cannot_be_written_is_exit_7_with_the_report_whole(
    finished_run, tmp_path, json_flag
):
    out = tmp_path / "again"
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "compare",
                *json_flag,
                "--out",
                str(out),
                "--backend",
                "jax",
                "--spec",
                "mlp-tiny",
                "--steps",
                "3",
                "--jax-record",
                str(finished_run / "jax"),
            ],
            cwd=REPO,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=process_env(),
            timeout=120,
        )
    assert proc.returncode == 7
    assert (
        proc.stderr.strip()
        == f"error: cannot write to stdout: No space left on device; the report is in {out}"
    )
    assert (
        json.loads((out / "report.json").read_text())["status"] == "ok"
        and (out / "report.md").is_file()
    )


@pytest.mark.error_case("demo-platform-bad")
@pytest.mark.parametrize(
    "platform, device, said",
    [
        (
            "nonsense",
            None,
            "PLATFORM=nonsense is not a platform of make demo: use cpu (the default), gpu or tpu",
        ),
        (
            "gpu",
            "/dev/nvidia0",
            "error: make demo PLATFORM=gpu needs an NVIDIA GPU, and this machine has none (no "
            "/dev/nvidiaN); use PLATFORM=cpu",
        ),
        (
            "tpu",
            "/dev/accel0",
            "error: make demo PLATFORM=tpu runs on a TPU VM, and this machine has no TPU (no "
            "/dev/accelN or /dev/vfio/N); use PLATFORM=cpu",
        ),
    ],
)
def test_make_demo_on_a_platform_this_machine_lacks_says_so_before_installing(
    platform, device, said
):
    if device and (os.path.exists(device) or os.path.exists("/dev/vfio/0")):
        pytest.skip(
            f"this machine has {device}: make demo PLATFORM={platform} would install its stack"
        )
    before = {p.name for p in REPO.iterdir()}
    proc = subprocess.run(
        ["make", "demo", f"PLATFORM={platform}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and said in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert {p.name for p in REPO.iterdir()} == before  # no environment made


@pytest.mark.error_case("backend-output-undecodable")
def test_a_backend_printing_bytes_that_are_not_utf8_is_read_to_its_end(tmp_path):
    """compare's reader of a backend's stdout stopped at the first undecodable byte; the backend
    then blocked on the full pipe until --timeout. Its bytes are now replaced, and its failure is
    its own."""
    fake = tmp_path / "python"
    fake.write_text(
        f"#!{sys.executable}\nimport os, sys\n"
        "os.write(1, b'\\xff\\xfe not utf-8\\n' + b'x' * 300000 + b'\\n')\n"
        "print('error: the fake backend failed', file=sys.stderr)\nsys.exit(3)\n"
    )
    fake.chmod(0o755)
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(tmp_path / "run"),
        "--backend",
        "jax",
        "--spec",
        "mlp-tiny",
        "--jax-python",
        str(fake),
        "--timeout",
        "60",
    )
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert proc.returncode == 3 and report["backends"]["jax"]["status"] == "failed", proc.stderr
    assert report["backends"]["jax"]["message"] == "the fake backend failed"
    assert (
        (tmp_path / "run" / "jax" / "stdout.log").read_text().startswith("\ufffd\ufffd not utf-8")
    )


@pytest.mark.slow
@pytest.mark.error_case("coordinator-unreachable")
def test_a_process_that_cannot_reach_its_coordinator_says_so_in_one_line(tmp_path):
    """jax.distributed ended such a process with a native abort and stack after five minutes; it now
    waits for the coordinator to accept a connection and says which it could not reach (the wait
    shortened here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    proc = run_cli(
        "jax_impl",
        "--spec",
        "mlp-tiny",
        "--steps",
        "2",
        "--mesh",
        "data=2",
        "--coordinator",
        f"127.0.0.1:{port}",
        "--num-processes",
        "2",
        "--process-id",
        "1",
        "--out",
        str(tmp_path / "run"),
        env={"XLA_TWINS_COORDINATOR_WAIT_S": "3"},
    )
    assert proc.returncode == 2 and "Check failure" not in proc.stderr + proc.stdout, proc.stderr[
        -2000:
    ]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: process 1 cannot reach the coordinator 127.0.0.1:{port} within 3 s (Connection "
        "refused): host 0 "
        "not started, another --coordinator, or a firewall between the hosts"
    )


@pytest.mark.slow
@pytest.mark.error_case("hosts-disagree")
# jax.distributed's collectives, and gloo's
@pytest.mark.parametrize("backend", ["jax_impl", "torch_impl"])
def test_processes_given_other_settings_refuse_together_instead_of_waiting_out_the_timeout(
    tmp_path, backend
):
    """Two processes of one run (as two hosts' compares start them) with other --steps: each waited
    on the other's collectives until --timeout; each now says so at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                backend,
                "--spec",
                "mlp-tiny",
                "--steps",
                steps,
                "--mesh",
                "data=2",
                "--coordinator",
                f"127.0.0.1:{port}",
                "--num-processes",
                "2",
                "--process-id",
                str(i),
                "--out",
                str(tmp_path / f"p{i}"),
            ],
            cwd=REPO,
            env=process_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, steps in enumerate(("3", "5"))
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [2, 2], outputs
    for i, steps in enumerate(("3", "5")):
        assert outputs[i][1].strip().splitlines()[-1] == (
            "error: the 2 processes of this run were given other training settings (this one, "
            f"process {i}: "
            f"train.steps={steps}, train.dtype=float32, --mesh data=2,fsdp=1,tensor=1); run the "
            "same command with the "
            "same flags on every host"
        )


def test_a_one_element_loss_is_refused_only_where_it_cannot_train():
    """torch's backward takes any one-element tensor (a loss kept as shape (1,) trains); jax.grad a
    scalar only: a correct torch side is never refused for it (common.twin.outputs.loss_refusal)."""
    import numpy as np

    from common.twin.outputs import loss_refusal

    class Twin:
        loss = {"torch": "losses.py:mse", "nnx": "losses.py:mse"}

    one = np.zeros((1,), np.float32)
    assert (
        loss_refusal(one, "torch", Twin) == "" and loss_refusal(np.float32(0.5), "nnx", Twin) == ""
    )
    assert loss_refusal(one, "nnx", Twin) == (
        "loss['nnx']='losses.py:mse' returns shape (1,); a loss returns a "
        "scalar (reduce it, e.g. with .mean())"
    )
    assert loss_refusal(np.zeros((1, 8), np.float32), "torch", Twin).endswith(
        "returns shape (1, 8); a loss returns a scalar (reduce it, e.g. with .mean())"
    )


@pytest.mark.slow
@pytest.mark.error_case("out-locked")
def test_two_hosts_sharing_one_out_are_told_so_and_host_0_says_why_it_stopped(tmp_path):
    """The same command on two hosts with one --out (here both on this machine): host 1 is refused
    the directory at once, saying each host writes its own, and tells host 0, which meets the other
    hosts before any backend starts (compare/runs/meeting.py): host 0 ends at once on host 1's
    reason, with no backend started (it used to wait at the coordinator until its wait ran out, and
    end on XLA's fatal line naming no host)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "shared"
    args = [
        "--quiet",
        "--out",
        str(out),
        "--backend",
        "jax",
        "--spec",
        "mlp-tiny",
        "--steps",
        "2",
        "--mesh",
        "data=2",
        "--num-hosts",
        "2",
        "--coordinator",
        f"127.0.0.1:{port}",
    ]
    env = {**process_env(), "XLA_TWINS_COORDINATOR_WAIT_S": "6"}
    host0 = subprocess.Popen(
        [sys.executable, "-m", "compare", *args, "--host-id", "0"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (out / MARKER).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    host1 = run_cli("compare", *args, "--host-id", "1", env={"XLA_TWINS_COORDINATOR_WAIT_S": "6"})
    assert host1.returncode == 2
    assert host1.stderr.strip().splitlines()[-1] == (
        f"error: another compare (pid {host0.pid}, run "
        f"{json.loads((out / MARKER).read_text())['run_id']}) is "
        f"writing to {out}; each host of a multi-host run writes its own --out: pass this host "
        "another one"
    )
    _, stderr = host0.communicate(timeout=60)
    assert host0.returncode == 2, stderr[-2000:]
    assert stderr.strip().splitlines()[
        -1
    ] == "error: host 1 refused this run: " + host1.stderr.strip().splitlines()[-1].removeprefix(
        "error: "
    )
    assert (
        not (out / "jax").exists() and json.loads((out / MARKER).read_text())["status"] == "refused"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.error_case("host-missing")
@pytest.mark.parametrize("host", [0, 1])
def test_a_host_that_never_comes_is_named_within_the_wait_before_any_backend_starts(tmp_path, host):
    """One host of a 4-host run alone (compare/runs/meeting.py): host 0 names the hosts that did not
    come, host 1 says host 0 did not answer, each within the coordinator's wait, exit 2, no backend
    started."""
    port = _free_port()
    out = tmp_path / "run"
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(out),
        "--backend",
        "jax",
        "--spec",
        "mlp-tiny",
        "--steps",
        "2",
        "--mesh",
        "data=4",
        "--num-hosts",
        "4",
        "--host-id",
        str(host),
        "--coordinator",
        f"127.0.0.1:{port}",
        env={"XLA_TWINS_COORDINATOR_WAIT_S": "2"},
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    where = f"127.0.0.1:{port + 256}"
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: host(s) 1, 2, 3 of 4 did not come to {where} within 2 s: not started, another "
        "--coordinator, or a "
        "firewall between the hosts"
        if host == 0
        else f"error: host 0 did not answer at {where} within 2 s: host 0 not started (or "
        "stopped), another "
        "--coordinator, or a firewall between the hosts"
    )
    assert (
        not (out / "jax").exists() and json.loads((out / MARKER).read_text())["status"] == "refused"
    )


def _host(tmp_path, port: int, name: str, *flags: str, wait: str = "20") -> subprocess.Popen:
    """A host of a run on this machine (mlp-tiny on jax, a mesh two or three hosts divide), started
    now."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "compare",
            "--quiet",
            "--backend",
            "jax",
            "--spec",
            "mlp-tiny",
            "--steps",
            "2",
            "--mesh",
            "data=6",
            "--set",
            "train.global_batch_size=96",
            "--coordinator",
            f"127.0.0.1:{port}",
            "--out",
            str(tmp_path / name),
            *flags,
        ],
        cwd=REPO,
        env={**process_env(), "XLA_TWINS_COORDINATOR_WAIT_S": wait},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _ended(proc: subprocess.Popen) -> tuple[int, str]:
    _, stderr = proc.communicate(timeout=90)
    return proc.returncode, stderr.strip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.error_case("hosts-layout")
def test_hosts_started_with_another_layout_or_one_number_are_stopped_before_any_backend_starts(
    tmp_path,
):
    """compare/runs/meeting.py: a host started with another --num-hosts is stopped by host 0, both
    naming it (it used to leave the backends' processes waiting at the coordinator for processes
    that never came); two hosts with one number are told so; a second host 0 cannot listen where the
    first does and says why."""
    port = _free_port()
    host0, other = (
        _host(tmp_path, port, "a0", "--num-hosts", "2", "--host-id", "0"),
        _host(tmp_path, port, "a1", "--num-hosts", "3", "--host-id", "1"),
    )
    said = (
        "host 1 was started with --num-hosts 3 (host 0: 2): run the same command on every host, "
        "each with its "
        "own --host-id"
    )
    assert _ended(host0) == (2, f"error: {said}") and _ended(other) == (
        2,
        f"error: host 0 stopped this run: {said}",
    )

    port = _free_port()
    host0 = _host(tmp_path, port, "b0", "--num-hosts", "3", "--host-id", "0")
    first, second = (
        _host(tmp_path, port, f"b{i}", "--num-hosts", "3", "--host-id", "1") for i in (1, 2)
    )
    said = "two hosts say they are host 1: give each host its own --host-id, 0 to 2"
    assert _ended(host0) == (2, f"error: {said}")
    assert (
        sorted([_ended(first), _ended(second)])
        == [(2, f"error: host 0 stopped this run: {said}")] * 2
    )

    port = _free_port()
    host0, again = (
        _host(tmp_path, port, "c0", "--num-hosts", "2", wait="4"),
        _host(tmp_path, port, "c1", "--num-hosts", "2", wait="4"),
    )
    ends = sorted([_ended(host0), _ended(again)], key=lambda e: "cannot meet" not in e[1])
    assert ends[0] == (
        2,
        f"error: cannot meet the other hosts at 127.0.0.1:{port + 256} (Address already in use): "
        "another host 0 of this run (give each host its own --host-id), or another run on that "
        "port (give another --coordinator port)",
    )
    assert ends[1][1].startswith("error: host(s) 1 of 2 did not come to")
    assert not any(
        (tmp_path / name / "jax").exists() for name in ("a0", "a1", "b0", "b1", "b2", "c0", "c1")
    )


def test_an_interrupt_while_a_group_starts_takes_the_group_down_then_reaches_its_handler(
    tmp_path, monkeypatch
):
    """A SIGTERM that came inside Popen, after the fork and before compare knew the pid, used to
    raise there and leave the backend running, unwatched. start_group holds it until the group is
    registered (`on_start`, compare's guard), then takes the group down and delivers it. The
    signal is sent from on_start: inside that window, every time."""
    import signal
    import tempfile

    from common.procs import pid_alive, start_group

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the group's own TMPDIR made here
    registered = []

    def on_start(pid):
        os.kill(os.getpid(), signal.SIGTERM)
        registered.append(pid)  # reached: the signal did not act inside the window

    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            start_group(
                [sys.executable, "-c", "import time; time.sleep(60)"],
                on_start=on_start,
                stdout=subprocess.DEVNULL,
            )
        assert signal.getsignal(signal.SIGTERM) is raise_interrupt  # the handler put back
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert len(registered) == 1 and not pid_alive(registered[0])
    assert list(tmp_path.iterdir()) == []  # its TMPDIR removed with it


@pytest.mark.slow
@pytest.mark.error_case("coordinator-port-taken")
@pytest.mark.parametrize("backend", ["jax_impl", "torch_impl"])
def test_a_coordinator_port_another_program_holds_is_one_line_with_the_fix(tmp_path, backend):
    """Process 0 of a multi-process run serves the coordinator: a port something else listens on
    ended on the framework's own log line (jax.distributed's, torch's TCPStore's); it is refused
    first, naming the port and the fix, exit 2."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli(
            backend,
            "--spec",
            "mlp-tiny",
            "--mesh",
            "data=2",
            "--steps",
            "2",
            "--num-processes",
            "2",
            "--process-id",
            "0",
            "--coordinator",
            f"127.0.0.1:{port}",
            "--out",
            str(tmp_path / "run"),
        )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[-1] == (
        f"error: --coordinator 127.0.0.1:{port}: port {port} is taken on this host (another run, "
        "or another program, listens there); give a free port (a multi-host run's launches take "
        "the ports after it too), or leave --coordinator out on one host"
    )
    assert not (tmp_path / "run").exists()

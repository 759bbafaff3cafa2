"""compare's own warm interpreters (compare/runs/warm.py, preload/): outside a test session's fork
servers, a run starts one server per backend and every process of the run on that backend is a fork
of it; the numbers are those of plain interpreters, and nothing of the servers is left."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.files.record import read_record
from preload.client import MANIFEST_ENV, OFF
from tests.helpers import REPO, process_env, processes_under

TWIN = "tests/data/user_project/twins.py:net"


def compare(out, tmp, env: dict, *args: str) -> dict:
    tmp.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "compare", "--out", str(out), "--quiet", *args]
    run_env = {**env, "TMPDIR": str(tmp)}
    proc = subprocess.run(
        command, cwd=REPO, env=run_env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "report.json").read_text())


@pytest.mark.slow
def test_every_process_of_a_run_is_a_fork_of_its_backends_warm_interpreter(tmp_path):
    """gpt-tiny on jax and eager torch with --check-determinism (each backend run twice):
    every process served by the run's own servers, none plain; the losses bit for bit those of
    plain interpreters (XLA_TWINS_PRELOAD=off); no server, socket or temporary folder left."""
    started = time.time()
    args = ("--spec", "gpt-tiny", "--backend", "jax,torch", "--steps", "2")
    own = {k: v for k, v in process_env().items() if k != MANIFEST_ENV}  # not the session's
    warm = compare(tmp_path / "warm", tmp_path / "tmp", own, *args, "--check-determinism")
    processes = warm["wall_time"]["processes"]
    # two main runs and their repeats, each a fork of its backend's server
    assert processes["served"] >= 4 and processes["plain"] == 0 and processes["waited_s"] >= 0
    plain = compare(tmp_path / "plain", tmp_path / "tmp", {**own, MANIFEST_ENV: OFF}, *args)
    assert plain["wall_time"]["processes"] is None  # XLA_TWINS_PRELOAD=off: fresh interpreters
    for backend in ("jax", "torch"):
        losses = [read_record(tmp_path / run / backend).losses for run in ("warm", "plain")]
        assert losses[0] == losses[1] and len(losses[0]) == 2, backend
    assert list((tmp_path / "tmp").iterdir()) == []  # every process group's folder
    # the servers' folder: in TMPDIR, or in /tmp where a socket's path would not fit in TMPDIR
    session = Path(os.environ.get(MANIFEST_ENV, "/none")).parent  # the test session's servers
    left = [
        p
        for p in Path("/tmp").glob("xla-twins-preload-*")
        if p != session and p.stat().st_mtime >= started
    ]
    assert left == [] and processes_under(tmp_path) == []


def _servers_running() -> set[int]:
    """The pids of live fork servers (any session's)."""
    found = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().split()[2]
        except OSError:
            continue
        if "preload.server" in cmdline and state != "Z":
            found.add(int(proc.name))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("delay_s", [0.5, 2.0])
def test_an_interrupt_while_the_servers_import_leaves_no_server_and_no_folder(tmp_path, delay_s):
    """SIGINT while compare's servers still import their frameworks (before anything is described):
    exit 4 with its line, every server gone with its folder (was: a server left running, orphaned,
    and its folder)."""
    before, started = _servers_running(), time.time()
    own = {k: v for k, v in process_env().items() if k != MANIFEST_ENV}
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "compare", "--quiet", "--twin", TWIN, "--out", str(tmp_path / "x")],
        cwd=REPO,
        env={**own, "TMPDIR": str(tmp_path / "tmp")},
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 4 and "Traceback" not in stderr, stderr[-2000:]
    time.sleep(1.0)  # a server ends when it reads its parent gone
    assert _servers_running() - before == set()
    session = Path(os.environ.get(MANIFEST_ENV, "/none")).parent
    left = [
        p
        for p in [*Path("/tmp").glob("xla-twins-preload-*"), *(tmp_path / "tmp").iterdir()]
        if p != session and p.stat().st_mtime >= started
    ]
    assert left == [] and not (tmp_path / "x").exists()

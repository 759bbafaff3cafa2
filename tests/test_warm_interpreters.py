"""compare's own warm interpreters (compare/runs/warm.py, preload/): outside a test session's fork
servers, a run starts one server per backend and every process of the run on that backend is a fork
of it; the numbers are those of plain interpreters, and nothing of the servers is left."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.files.record import read_record
from preload.client import MANIFEST_ENV
from tests.helpers import REPO, process_env, processes_under


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
    plain interpreters (a run under a manifest of no servers); no server, socket or temporary
    folder left."""
    started = time.time()
    args = ("--spec", "gpt-tiny", "--backend", "jax,torch", "--steps", "2")
    own = {k: v for k, v in process_env().items() if k != MANIFEST_ENV}  # not the session's
    warm = compare(tmp_path / "warm", tmp_path / "tmp", own, *args, "--check-determinism")
    processes = warm["wall_time"]["processes"]
    # two main runs and their repeats, each a fork of its backend's server
    assert processes["served"] >= 4 and processes["plain"] == 0 and processes["start_s"] > 0
    none = tmp_path / "no-servers.json"
    none.write_text(json.dumps({"servers": []}))
    plain = compare(tmp_path / "plain", tmp_path / "tmp", {**own, MANIFEST_ENV: str(none)}, *args)
    assert plain["wall_time"]["processes"] is None  # under a manifest: none of its own
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

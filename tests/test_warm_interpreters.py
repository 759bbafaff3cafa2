"""compare's own warm interpreters (compare/runs/warm.py, preload/): outside a test session's fork
servers, a run starts one server per backend and every process of the run on that backend is a fork
of it; the numbers are those of plain interpreters, and nothing of the servers is left."""

import json
import shutil
import signal
import subprocess
import sys
import tempfile
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
    # a TMPDIR short enough for the servers' sockets: their folder is made there, and must go
    tmp = Path(tempfile.mkdtemp(prefix="xw-", dir="/tmp"))
    args = ("--spec", "gpt-tiny", "--backend", "jax,torch", "--steps", "2")
    own = {k: v for k, v in process_env().items() if k != MANIFEST_ENV}  # not the session's
    warm = compare(tmp_path / "warm", tmp, own, *args, "--check-determinism")
    processes = warm["wall_time"]["processes"]
    # two main runs and their repeats, each a fork of its backend's server
    assert processes["served"] >= 4 and processes["plain"] == 0 and processes["waited_s"] >= 0
    plain = compare(tmp_path / "plain", tmp, {**own, MANIFEST_ENV: OFF}, *args)
    assert plain["wall_time"]["processes"] is None  # XLA_TWINS_PRELOAD=off: fresh interpreters
    for backend in ("jax", "torch"):
        losses = [read_record(tmp_path / run / backend).losses for run in ("warm", "plain")]
        assert losses[0] == losses[1] and len(losses[0]) == 2, backend
    left = list(tmp.iterdir())  # the servers' folder, every process group's
    shutil.rmtree(tmp)
    assert left == [] and processes_under(tmp_path) == []


def _servers_of(parent: int) -> dict[int, Path]:
    """{pid: its socket's folder} of the live fork servers that `parent` started."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if "preload.server" in args and stat[0] != "Z" and int(stat[1]) == parent:
            found[int(proc.name)] = Path(args[args.index("--socket") + 1]).parent
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            if (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                alive.add(pid)
        except OSError:
            pass
    return alive


@pytest.mark.slow
@pytest.mark.parametrize("after_s", [0.0, 1.5])
def test_an_interrupt_while_the_servers_import_leaves_no_server_and_no_folder(tmp_path, after_s):
    """SIGINT once compare's servers started, while they still import their frameworks (before
    anything is described): exit 4 with its line, every server gone with its folder (was: a server
    left running, orphaned, and its folder)."""
    own = {k: v for k, v in process_env().items() if k != MANIFEST_ENV}
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "compare", "--quiet", "--twin", TWIN, "--out", str(tmp_path / "x")],
        cwd=REPO,
        env={**own, "TMPDIR": str(tmp_path / "tmp")},
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (servers := _servers_of(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert servers, "compare started no server"
    time.sleep(after_s)
    servers |= _servers_of(proc.pid)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 4 and "Traceback" not in stderr, stderr[-2000:]
    assert stderr.strip().endswith("interrupted by a signal; what compare had started is stopped")
    time.sleep(1.0)  # a server ends when it reads its parent gone
    assert _alive(set(servers)) == set()
    # the servers' folder (in /tmp: a socket's path would not fit in this TMPDIR), every group's
    assert not any(folder.exists() for folder in servers.values())
    assert list((tmp_path / "tmp").iterdir()) == [] and not (tmp_path / "x").exists()


@pytest.mark.slow
def test_a_hugging_face_model_imports_nothing_of_transformers_beyond_its_own_after_its_base():
    """What the suite's servers preload beside torch (common/backends.py `HF_MODEL_BASE`) is the
    model base every modeling file imports: a Llama built, run and trained from its config after
    it imports no module outside its own package (with transformers alone: ~1,500, ~1 CPU-s a
    process)."""
    code = (
        "import importlib, json, sys, torch\n"
        "from common.backends import HF_MODEL_BASE\n"
        "for name in HF_MODEL_BASE: importlib.import_module(name)\n"
        "before = set(sys.modules)\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,\n"
        "    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)\n"
        "tokens = torch.zeros(1, 8, dtype=torch.long)\n"
        "LlamaForCausalLM(config)(tokens, labels=tokens).loss.backward()\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = json.loads(proc.stdout.splitlines()[-1])
    assert imported and all(m.startswith("transformers.models.llama") for m in imported), imported

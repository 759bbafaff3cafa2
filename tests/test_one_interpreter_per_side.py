"""A `--twin` compare imports each side's framework once (issue 44): after the twin file's import
check, the process that describes a side goes on to make that side's run (driver/describe_sides.py
--wait-for-run, compare/runs/launch.py describing_runs), and that run is the run a fresh process
makes: the same losses bit for bit, the same compiles."""

import ast
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from common.files.record import read_record
from tests.helpers import PLAIN, REPO, process_env

TWIN = f"{REPO}/tests/data/user_project/twins.py:net"

# every Python process the run starts writes its argv (the guard runs
# isolated, `python -I`: not logged)
SITECUSTOMIZE = """
import os, sys
if os.environ.get("PROCESS_LOG"):
    with open(os.environ["PROCESS_LOG"], "a") as f:
        f.write(repr((sys.argv, os.getpid())) + "\\n")
"""


def compare_logged(
    tmp_path: Path, name: str, backends: str, twin: str = TWIN, *args: str
) -> tuple[Path, list[tuple[list[str], int]]]:
    """A plain (unserved) compare run of `twin` on `backends`, and the (argv, pid) of every process
    it started."""
    (tmp_path / "site").mkdir(exist_ok=True)
    (tmp_path / "site" / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    log, out = tmp_path / f"{name}.log", tmp_path / name
    env = process_env(**PLAIN, PROCESS_LOG=str(log))
    env["PYTHONPATH"] = f"{tmp_path / 'site'}:{env['PYTHONPATH']}"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "compare",
            "--quiet",
            "--twin",
            twin,
            "--backend",
            backends,
            "--out",
            str(out),
            "--steps",
            "3",
            *args,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, [ast.literal_eval(line) for line in log.read_text().splitlines()]


def after_import_check(started: list[tuple[list[str], int]]) -> list[tuple[list[str], int]]:
    """The processes after compare itself and the twin file's loader (`python -c`)."""
    loader = next(i for i, (argv, _) in enumerate(started) if argv[0] == "-c")
    return started[loader + 1 :]


@pytest.mark.slow
def test_a_twin_compare_starts_one_interpreter_per_side_after_the_import_check(tmp_path):
    shared, argvs = compare_logged(tmp_path, "shared", "jax,torch")
    later = after_import_check(argvs)
    assert len(later) == 2, later
    assert sorted(argv[1:3] for argv, _ in later) == [
        ["--wait-for-run", "jax_impl.describe"],
        ["--wait-for-run", "torch_impl.describe"],
    ]
    report = json.loads((shared / "report.json").read_text())
    assert report["status"] == "ok" and report["exit_code"] == 0

    # the NNX side's process waits only where its run is the first (it holds JAX's device): torch
    # first, the jax run is a fresh process, and a third interpreter describes the NNX side
    fresh, argvs = compare_logged(tmp_path, "fresh", "torch,jax")
    later = after_import_check(argvs)
    waiting = [argv[1:3] for argv, _ in later if argv[1] == "--wait-for-run"]
    assert waiting == [["--wait-for-run", "torch_impl.describe"]]
    # the waiting torch side, the NNX side's describe step, the jax run
    assert len(later) == 3, later

    ran_after_describing, ran_fresh = read_record(shared / "jax"), read_record(fresh / "jax")
    assert ran_after_describing.losses == ran_fresh.losses  # bit for bit
    # (setup and loop: the same programs compiled, none taken from the describing)
    assert ran_fresh.compile_events
    assert [(e.phase, e.step) for e in ran_after_describing.compile_events] == [
        (e.phase, e.step) for e in ran_fresh.compile_events
    ]
    assert read_record(shared / "torch").losses == read_record(fresh / "torch").losses


@pytest.mark.slow
def test_a_run_the_describing_left_unfit_starts_in_a_fresh_interpreter_in_its_place(tmp_path):
    """A user's model file that initialises JAX at import (a module-level constant): torchax sets
    JAX's CPU device count before JAX starts, so its run cannot be made in the process that
    described the torch side; that process becomes a fresh interpreter (same pid: compare waits on
    it as before) and the run passes."""
    project = tmp_path / "project"
    shutil.copytree(REPO / "tests" / "data" / "user_project", project)
    models = (project / "models.py").read_text()
    (project / "models.py").write_text(
        models.replace(
            "from torch import nn\n",
            "from torch import nn\n\nSCALE = float(jax.numpy.ones(()))  # JAX initialised\n",
            1,
        )
    )
    out, argvs = compare_logged(
        tmp_path, "run", "torchax,jax", f"{project}/twins.py:net", "--mesh", "data=2"
    )
    later = after_import_check(argvs)
    waiting = [
        i
        for i, (argv, _) in enumerate(later)
        if argv[1:3] == ["--wait-for-run", "torch_impl.describe"]
    ]
    assert len(waiting) == 1
    pid = later[waiting[0]][1]
    torchax_run = [
        argv for argv, p in later if p == pid and str(out / "torchax" / "spec.json") in argv
    ]
    assert len(torchax_run) == 1, later  # the same process, exec'd to run torchax
    assert json.loads((out / "report.json").read_text())["status"] == "ok"

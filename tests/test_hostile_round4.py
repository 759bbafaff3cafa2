"""Reliability round 4 (issue 46): hostile input on the surfaces of wave 3 is one line naming it, its own exit
code, and nothing of the user's touched."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO, process_env, run_cli


@pytest.mark.error_case("path-symlink-loop")
@pytest.mark.parametrize("flag, ref", [("--out", "{loop}"), ("--twin", "{loop}.py:twin"), ("--jax-record", "{loop}"),
                                       ("--checkpoint", "canonical:{loop}"), ("--spec", "{loop}.toml")])
def test_a_symlink_loop_given_as_a_path_is_a_usage_error(tmp_path, flag, ref):
    loop = tmp_path / "a"
    for name, target in (("a", "b"), ("b", "a"), ("a.py", "b.py"), ("b.py", "a.py"), ("a.toml", "b.toml"),
                         ("b.toml", "a.toml")):
        os.symlink(target, tmp_path / name)
    links = {p.name: os.readlink(p) for p in tmp_path.iterdir()}
    value = ref.format(loop=loop)
    proc = run_cli("compare", "--quiet", "--backend", "jax", "--steps", "1", flag, value)
    shown = value.partition(":")[2] if flag == "--checkpoint" else value.rpartition(":")[0] if flag == "--twin" \
        else value
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"error: {flag} {shown}: a loop of symbolic links; point it at a real file or folder"
    assert {p.name: os.readlink(p) for p in tmp_path.iterdir()} == links  # nothing made, nothing followed


@pytest.mark.slow
def test_a_torch_backend_killed_at_its_timeout_leaves_nothing_in_tmpdir(tmp_path):
    """torch's imports make a folder in TMPDIR that only a normal exit removes: each process group compare starts
    has a TMPDIR of its own, removed once the group is gone, however it ended (common/procs.py)."""
    (tmp_path / "tmp").mkdir()
    proc = run_cli("compare", "--quiet", "--out", str(tmp_path / "run"), "--backend", "torch", "--spec",
                   "gpt-tiny", "--steps", "5000", "--timeout", "15", env={"TMPDIR": str(tmp_path / "tmp")})
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert proc.returncode == 3 and report["backends"]["torch"]["status"] == "timeout", proc.stderr[-2000:]
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.error_case("stdout-full")
@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["tables", "json"])
def test_a_stdout_that_cannot_be_written_is_exit_7_with_the_report_whole(finished_run, tmp_path, json_flag):
    out = tmp_path / "again"
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "compare", *json_flag, "--out", str(out), "--backend", "jax",
                               "--spec", "mlp-tiny", "--steps", "3", "--jax-record", str(finished_run / "jax")],
                              cwd=REPO, stdout=full, stderr=subprocess.PIPE, text=True, env=process_env(), timeout=120)
    assert proc.returncode == 7
    assert proc.stderr.strip() == f"error: cannot write to stdout: No space left on device; the report is in {out}"
    assert json.loads((out / "report.json").read_text())["status"] == "ok" and (out / "report.md").is_file()

"""Reliability round 4 (issue 46): hostile input on the surfaces of wave 3 is one line naming it, its own exit
code, and nothing of the user's touched."""
from __future__ import annotations

import os

import pytest

from tests.helpers import run_cli


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

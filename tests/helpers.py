"""Run the real CLIs in subprocesses, as a user would."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common.files.record import RunRecord, read_record
from preload import client as preload_client

REPO = Path(__file__).resolve().parents[1]
# compare's default compile cache lives under $XDG_CACHE_HOME: the suite gets its own, so tests
# neither read nor fill the user's cache. `make test` names one it keeps between runs
# (XLA_TWINS_TEST_CACHE_HOME, the checkout's .test-cache): a second run loads the JAX programs the
# first compiled. Otherwise the first process that imports this module makes one (tests/conftest.py:
# pytest's, before pytest-xdist starts its test processes, which inherit it) and removes it at
# exit. Every test process shares it.
CACHE_HOME = os.environ.get("XLA_TWINS_TEST_CACHE_HOME") or None
if CACHE_HOME is None:
    CACHE_HOME = tempfile.mkdtemp(prefix="xla-twins-test-cache-")
    atexit.register(shutil.rmtree, CACHE_HOME, ignore_errors=True)
CACHE_HOME = os.environ["XLA_TWINS_TEST_CACHE_HOME"] = os.path.abspath(CACHE_HOME)
# a kept folder is the suite's only if it says so: one named by mistake (TEST_CACHE=$HOME) is
# refused, never filled or emptied
CACHE_MARKER = ".xla-twins-test-cache"
os.makedirs(CACHE_HOME, exist_ok=True)
if not os.path.exists(os.path.join(CACHE_HOME, CACHE_MARKER)):
    if os.listdir(CACHE_HOME):
        print(
            f"error: XLA_TWINS_TEST_CACHE_HOME={CACHE_HOME} holds files the suite did not write: "
            "name a new or empty folder (make test TEST_CACHE=...)",
            file=sys.stderr,
        )
        raise SystemExit(4)  # pytest's code for a usage error, apart from failed tests' 1
    Path(CACHE_HOME, CACHE_MARKER).touch()
# its compile caches only grow (every changed program adds its executable): emptied past this size
# at a session's start (tests/conftest.py); the whole suite's are ~110-170 MB
KEPT_CACHE_BOUND = 2 << 30


def bound_kept_cache() -> None:
    """The kept folder's compile caches emptied if they have grown over KEPT_CACHE_BOUND bytes.
    Called by the session's first process only, before any test process starts: one that empties
    them under another's run would take the programs that run is loading."""
    caches = Path(CACHE_HOME, "xla-twins", "compile-cache")
    if sum(f.stat().st_size for f in caches.rglob("*") if f.is_file()) > KEPT_CACHE_BOUND:
        shutil.rmtree(caches, ignore_errors=True)


# a test that watches processes by their command lines starts them as fresh interpreters, not as
# children of the session's fork servers (tests/preloaded.py), whose command line is the server's
PLAIN = {
    preload_client.MANIFEST_ENV: preload_client.OFF
}  # nor compare's own (compare/runs/warm.py)


def process_env(**extra: str) -> dict[str, str]:
    """The environment of a process the tests start: this checkout importable (after whatever
    PYTHONPATH the session set: tests/conftest.py's backend guard), the suite's own compile
    cache."""
    path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO)]))
    return {**os.environ, "PYTHONPATH": path, "XDG_CACHE_HOME": CACHE_HOME, **extra}


def run_cli(
    module: str, *args: str, timeout: float = 600, env: dict | None = None, shell_prefix: str = ""
) -> subprocess.CompletedProcess:
    """`python -m module args`; `shell_prefix`: sh commands run first in the same process (`ulimit
    ...`)."""
    full_env = process_env(**(env or {}))
    command = [sys.executable, "-m", module, *args]
    if shell_prefix:  # (no preexec_fn: it forks a process whose parent runs JAX's threads)
        command = ["sh", "-c", f'{shell_prefix}; exec "$0" "$@"', *command]
        return subprocess.run(
            command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=full_env
        )
    # a session's server, or plain
    return preload_client.run(command, cwd=REPO, timeout=timeout, env=full_env)


def train(backend: str, out: Path, *args: str, env: dict | None = None) -> RunRecord:
    """Run a backend (no pipelined throughput phase, to keep tests short) and read its record."""
    proc = run_cli(backend, "--out", str(out), "--throughput-steps", "0", *args, env=env)
    assert proc.returncode == 0, (
        f"{backend} {args} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    )
    return read_record(out)


def max_loss_diff(a: RunRecord, b: RunRecord) -> float:
    assert len(a.losses) == len(b.losses)
    return max(abs(x - y) for x, y in zip(a.losses, b.losses))


def processes_under(path: Path) -> list[str]:
    """Command lines of live processes that mention `path` (a twin loader, a describe step, a
    backend)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(
                (
                    ln
                    for ln in (proc / "status").read_text().splitlines()
                    if ln.startswith("State:")
                ),
                "",
            )
        except OSError:
            continue
        if str(path) in cmdline and int(proc.name) != os.getpid() and "zombie" not in state:
            found.append(f"{proc.name}: {cmdline}")
    return found


def device_summary_case():
    """(name, float32 host array with a NaN and an -inf): what each backend's device summary is
    checked on."""
    import numpy as np

    rng = np.random.default_rng(0)
    host = rng.normal(size=(96, 700)).astype(np.float32) * 1e-3
    host[3, 5], host[40, 1] = np.nan, -np.inf
    return "grads/h.0.mlp.kernel", host


def assert_summary_agrees_with_the_hosts(ours, theirs) -> None:
    """A summary made on the devices (`ours`) against the host's of the same float32 values: the
    sample, the largest magnitude and the counts exactly, the sums within float32 rounding, as
    compare's second pass allows."""
    import numpy as np
    import pytest

    from compare.runs.second_pass import _differs

    assert ours.shape == theirs.shape and np.array_equal(ours.indices, theirs.indices)
    assert ours.values.dtype == np.float32 and np.array_equal(
        ours.values, theirs.values, equal_nan=True
    )
    assert {k: ours.stats[k] for k in ("count", "nonfinite", "max_abs")} == {
        k: theirs.stats[k] for k in ("count", "nonfinite", "max_abs")
    } and ours.stats["nonfinite"] == 2
    assert ours.stats["sum"] == pytest.approx(theirs.stats["sum"], rel=1e-4)
    assert ours.stats["sum_sq"] == pytest.approx(theirs.stats["sum_sq"], rel=1e-5)
    assert ours.on_device and not theirs.on_device and _differs(ours, theirs) is None


def judged_of(parity: dict, *, dtype: str = "float32", policy: str = "fixed", reference="jax"):
    """A judgement of a run (compare/judge/judgement.py) holding the pairs `parity` alone, as an
    extra run reads one to decide whether it runs."""
    from common.presets import load_spec
    from common.vocab import ExitCode, ReportStatus
    from compare.judge.judgement import Judgement, ReportInputs

    spec = load_spec("mlp-tiny", [f"train.dtype={dtype}"])
    inputs = ReportInputs(spec, {}, [reference, *parity], reference, Path("."), None)
    return Judgement(
        inputs,
        {},
        {},
        {},
        {},
        parity,
        {"policy": policy},
        [],
        ReportStatus.OK,
        ExitCode.OK,
        "",
        {},
        {},
        [],
    )

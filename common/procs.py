"""Starting a subprocess in a process group of its own and taking that whole group down: one
definition for compare's backends, its describe steps and the loader of a user's twin file (each
started by start_group, so its pid is its group)."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NoReturn

from preload import client as preload_client
from preload.client import interrupts_held

# the folder that holds our packages: a checkout's root, or the
# site-packages a wheel was installed into
PACKAGES_ROOT = Path(__file__).resolve().parents[1]


def toolkit_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: ours) for another interpreter that imports this toolkit: a checkout's root
    first on its PYTHONPATH. An installed toolkit adds nothing: its site-packages there would shadow
    the other interpreter's own packages (a TPU VM's second environment, which installs the toolkit
    too)."""
    env = dict(os.environ if env is None else env)
    if (PACKAGES_ROOT / "pyproject.toml").is_file():
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(PACKAGES_ROOT), env.get("PYTHONPATH")])
        )
    return env


def start_group(command: list[str], env: dict | None = None, on_start=None, **popen_args):
    """subprocess.Popen(command, start_new_session=True, ...): its pid is its group, which
    kill_group takes down with whatever it started. Its TMPDIR is a folder of its own, made in the
    caller's and removed by kill_group: what the group leaves there (torch's imports make a folder;
    a crash, a kill or a timeout leaves it) goes with it. Where the test suite runs a preloading
    fork server for this interpreter and module (preload/), a child of that server runs the command
    instead, its frameworks already imported.

    `on_start(pid)` registers the group (compare's guard) before an interrupt can act: one that
    comes while the process starts (after the fork, before its pid is known) is held until then;
    the group is taken down and the interrupt delivered to its handler as it came."""
    own_tmp = tempfile.mkdtemp(prefix="xla-twins-group-")
    env = {**(os.environ if env is None else env), "TMPDIR": own_tmp}
    with interrupts_held() as pending:
        try:
            proc = preload_client.start(command, env=env, start_new_session=True, **popen_args)
        except BaseException:
            shutil.rmtree(own_tmp, ignore_errors=True)
            raise
        proc.own_tmp = own_tmp
        if on_start is not None:
            on_start(proc.pid)
    if pending:
        kill_group(proc)
        signal.raise_signal(pending[0])
    return proc


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (one of another user's counts: it cannot be signalled, but it is
    there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(proc: subprocess.Popen, grace_s: float = 0.0) -> None:
    """SIGTERM the group, then SIGKILL whatever is left after `grace_s` (grace_s=0: SIGKILL at
    once); then reap `proc` and remove its own TMPDIR (start_group). Also after a normal exit:
    children it started must not outlive it."""
    pgid = proc.pid
    for sig in [signal.SIGTERM, signal.SIGKILL] if grace_s > 0 else [signal.SIGKILL]:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            # a fork server's child killed before its setsid (preload/server.py): no group yet, the
            # process is there (was: left running, waiting for a run, while compare waited on it)
            try:
                os.kill(proc.pid, sig)
            except ProcessLookupError:
                break
        except PermissionError:
            break
        if _gone_within(proc, pgid, max(grace_s, 0.05)):
            break
    proc.wait()
    if getattr(proc, "own_tmp", None):
        shutil.rmtree(proc.own_tmp, ignore_errors=True)


def _gone_within(proc: subprocess.Popen, pgid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None and not group_alive(pgid):
            return True
        time.sleep(0.05)
    return False


def exit_process(code: int) -> NoReturn:
    """End a toolkit process (compare, a backend, a describe or export step) once its files are
    written: the exit hooks run (atexit: jax.distributed's shutdown, logging's flush, temporary
    folders' removal), then the process ends without the interpreter's teardown, which frees every
    module's objects one by one and runs the frameworks' destructors for nothing the run needs
    (measured on gpt-tiny: torch_xla 0.8 s, torch 0.4 s, jax 0.17 s of compare's wall time;
    compare's own, numpy, rich and matplotlib loaded, ~0.1 s). A thread still working keeps the
    normal exit, which waits for it."""
    if any(
        t.is_alive() and not t.daemon
        for t in threading.enumerate()
        if t is not threading.main_thread()
    ):
        sys.exit(code)
    _drop_freeing_hooks()
    atexit._run_exitfuncs()  # noqa: SLF001  (the hooks a normal exit runs first)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _drop_freeing_hooks() -> None:
    """JAX's exit hook (jax._src.api.clean_up, registered at its import) clears every cache and
    destroys its PJRT clients one by one, 0.05-0.15 s after a run (measured), then shuts
    jax.distributed down: os._exit frees the memory at once. Kept in a process that joined a
    jax.distributed run, whose shutdown the others wait on. Read from sys.modules: common imports
    no framework."""
    api, distributed = sys.modules.get("jax._src.api"), sys.modules.get("jax._src.distributed")
    clean_up = getattr(api, "clean_up", None)
    state = getattr(distributed, "global_state", None)
    if clean_up is None or state is None:
        return
    if getattr(state, "client", None) is None and getattr(state, "service", None) is None:
        atexit.unregister(clean_up)

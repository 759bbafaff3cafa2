"""python -m driver.describe_sides [--wait-for-run] MODULE ARGS... [--then MODULE ARGS...]: the
describe steps of a twin's sides run one after the other in one interpreter, and, with
--wait-for-run, that side's run after them.

compare describes each side of a twin in the interpreter of the backends that run it
(compare/runs/prepare.py). Where both sides have the same one (the CPU default, a GPU machine), one
process describes both: a twin file imports both frameworks, so two processes paid both imports
twice (~2 CPU-s a twin compare). Each MODULE's `main(argv)` runs in turn (`torch_impl.describe`,
`jax_impl.describe`); the first that fails ends the process with its exit code, and compare tells
which side it was from the files each side writes.

--wait-for-run: the process then says `described` on stdout and waits for one line on stdin: the run
compare hands it (common/protocol.py run_request), which it makes as `python -m MODULE ARGV` would
have, its stderr into the run's log, so a side's framework is imported and its twin file run once,
not once to describe and again to train. The end of stdin (compare had no run for it, or is gone)
ends it with 0. This module imports no framework itself: the modules it is given do.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys

from common.procs import exit_process
from common.protocol import DESCRIBED, THEN, WAIT_FOR_RUN, read_run_request


def steps(argv: list[str]) -> list[tuple[str, list[str]]]:
    """[(module, its argv)] from `MODULE ARGS... --then MODULE ARGS...`."""
    out, current = [], []
    for arg in [*argv, THEN]:
        if arg != THEN:
            current.append(arg)
        elif current:
            out.append((current[0], current[1:]))
            current = []
    return out


def run_requested() -> int:
    """The run compare hands this process, made as its own `python -m` would: its argv, its stderr
    into the run's log, stdin at the end of input; 0 when compare hands it none."""
    print(DESCRIBED, flush=True)
    request = read_run_request(sys.stdin.readline())
    if request is None:
        return 0
    module, argv, stderr = request
    sys.stderr.flush()
    for fd, path, flags in (
        (2, stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (0, os.devnull, os.O_RDONLY),
    ):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    # a fresh interpreter in this process's place: same pid, descriptors, group
    if not _can_run_here(module):
        os.execv(sys.executable, [sys.executable, "-m", module, *argv])
    sys.argv = [module, *argv]
    # a backend's __main__ ends the process itself
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


def _can_run_here(module: str) -> bool:
    """Whether the describing left this interpreter as the run needs it: torch_xla not yet imported
    (torch_xla_impl sets the environment it reads at import), JAX's backends not yet initialised (a
    runtime sets its CPU device count first), except by the NNX side's describe step, which sets the
    count its jax run sets. The user's code could have done either while its twin was described."""
    xla_bridge = sys.modules.get("jax._src.xla_bridge")
    jax_started = xla_bridge is not None and xla_bridge.backends_are_initialized()
    return "torch_xla" not in sys.modules and (module == "jax_impl" or not jax_started)


def main(argv: list[str]) -> int:
    wait = argv[:1] == [WAIT_FOR_RUN]
    for module, args in steps(argv[wait:]):
        code = importlib.import_module(module).main(args)
        if code:
            return code
    return run_requested() if wait else 0


if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))

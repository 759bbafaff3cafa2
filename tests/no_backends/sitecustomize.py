"""`make test-fast` starts no backend process, and this proves it.

tests/conftest.py puts this directory first on PYTHONPATH when the slow tests are deselected, so
every Python process the tests start (and the ones those start: compare's backends, a twin's
describe step) imports this module first. A process started to run a backend (`python -m <package>`
of a registered backend, or `python -m <package>.<step>`: a twin's describe or export step) writes
its command line to $XLA_TWINS_BACKEND_GUARD and exits 97 before any of the backend's code runs; the
session then fails, naming it.
"""

import os
import sys

_LOG = os.environ.get("XLA_TWINS_BACKEND_GUARD")
_PACKAGES = set(filter(None, os.environ.get("XLA_TWINS_BACKEND_GUARD_PACKAGES", "").split(",")))


def _module_run() -> str | None:
    """The module of `python [options] -m MODULE ...`; None for a script or `-c`."""
    args = iter(sys.orig_argv[1:])
    for arg in args:
        if arg == "-m":
            return next(args, None)
        if arg in ("-X", "-W"):  # an option with its value apart
            next(args, None)
        elif arg == "-c" or not arg.startswith("-"):
            return None
    return None


if _LOG and _PACKAGES and (_module := _module_run()) and _module.split(".")[0] in _PACKAGES:
    with open(_LOG, "a") as _log:
        _log.write(" ".join(sys.orig_argv) + "\n")
    sys.stderr.write(
        f"error: make test-fast started a backend process (python -m {_module}); mark its test "
        "slow\n"
    )
    os._exit(97)

"""The environment variables the toolkit reads, each defined once with its check: read when used,
validated once at the start of compare and of every backend process (`check_environment`), so a
bad value is one line and exit 2 before anything runs, never a traceback at import or a hang."""

from __future__ import annotations

import math
import os

from common.spec import SpecError

COORDINATOR_WAIT = "XLA_TWINS_COORDINATOR_WAIT_S"
COORDINATOR_WAIT_DEFAULT_S = 300.0
COORDINATOR_WAIT_MAX_S = 86400.0  # a day: longer is a typo, and `nan` or `inf` would wait forever


class EnvironmentVariableError(SpecError):
    """An environment variable the toolkit reads holds a value it cannot use."""


def coordinator_wait_s() -> float:
    """How long a process waits for host 0 or its coordinator (XLA_TWINS_COORDINATOR_WAIT_S)."""
    raw = os.environ.get(COORDINATOR_WAIT)
    if raw is None or not raw.strip():
        return COORDINATOR_WAIT_DEFAULT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= COORDINATOR_WAIT_MAX_S:
        raise EnvironmentVariableError(
            f"{COORDINATOR_WAIT}={raw!r} is not a number of seconds over 0 and at most "
            f"{COORDINATOR_WAIT_MAX_S:g}; set one, or unset it for the default "
            f"{COORDINATOR_WAIT_DEFAULT_S:g} s"
        )
    return value


# the fork servers a process's commands go to (preload/client.py): a manifest's path (a compare
# run's own, a test session's), or "off": every process a fresh interpreter (compare starts none)
PRELOAD = "XLA_TWINS_PRELOAD"
PRELOAD_OFF = "off"


def preload_setting() -> str | None:
    """XLA_TWINS_PRELOAD: None (unset: compare starts its own servers), "off", or a manifest that
    exists."""
    raw = os.environ.get(PRELOAD)
    if raw is None or raw == PRELOAD_OFF:
        return raw
    if not os.path.isfile(raw):
        raise EnvironmentVariableError(
            f"{PRELOAD}={raw!r} names no fork servers' manifest (a file); set it to "
            f"{PRELOAD_OFF!r} to start every process as a fresh interpreter, or unset it"
        )
    return raw


CHECKS = (coordinator_wait_s, preload_setting)


def check_environment() -> None:
    """Every variable of this table read once: raises EnvironmentVariableError at the first bad
    one."""
    for check in CHECKS:
        check()

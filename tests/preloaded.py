"""The suite's fork servers (preload/servers.py): one per backend, importing what the backend's row
says its processes import first (common/backends.py `preload`), and one for compare itself, started
by the test session.

A backend or describe step the tests start then skips 1-6 s of imports, compare itself ~0.4 s.
Every server is this interpreter with the session's environment, so a command served by one runs as
a plain process would (preload/server.py declines any other). compare, seeing the session's servers,
starts none of its own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from common import backends
from preload.client import MANIFEST_ENV, OFF  # noqa: F401  (OFF: tests/conftest.py)
from preload.servers import Servers, ServerSpec

REPO = Path(__file__).resolve().parents[1]
# compare imports no framework, but numpy, rich, safetensors and (for its plots) matplotlib: ~0.4
# CPU-s of each of the suite's ~300 compare processes; its own modules are not preloaded (their
# module state is per run)
COMPARE_IMPORTS = (
    "numpy",
    "rich.console",
    "rich.live",
    "rich.progress",
    "rich.table",
    "rich.text",
    "safetensors.numpy",
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
)
# the describe step of a twin whose sides share an interpreter imports both frameworks: torchax's
# server holds both
EXTRA_ROUTES = {"torchax": ("driver.describe_sides",)}
# compare's loader of a twin file (`python -c`, common/twin/__init__.py: ~0.25 CPU-s started plain):
# compare's server, which imports no framework, so the loader's check that the file imports none
# sees what a plain process would
COMPARE_ROUTES = ("compare", "-c")


def routes(row) -> tuple[str, ...]:
    """What a backend's server serves: its package, and its step benchmark (benchmarks/: the suite's
    benchmark test starts one per backend and model, each importing its framework again)."""
    return (row.package, *EXTRA_ROUTES.get(row.name, ()), f"benchmarks.overhead_{row.name}")


def server_specs() -> list[ServerSpec]:
    """A server per backend; the suite's twins are mostly Hugging Face's models, so every server
    that imports torch also imports transformers' model base (common/backends.py
    `HF_MODEL_BASE`)."""
    rows = [backends.info(n) for n in backends.names()]
    return [
        *(
            ServerSpec(
                r.name,
                sys.executable,
                (*r.preload, *(backends.HF_MODEL_BASE if "torch" in r.preload else ())),
                routes(r),
            )
            for r in rows
            if r.preload
        ),
        ServerSpec("compare", sys.executable, COMPARE_IMPORTS, COMPARE_ROUTES),
    ]


def start() -> Servers:
    """The servers, started without waiting for their imports (until a socket exists, commands start
    plain), and XLA_TWINS_PRELOAD set for this process and every process it starts."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
    }
    servers = Servers(server_specs(), env, cwd=REPO)
    os.environ[MANIFEST_ENV] = str(servers.manifest)
    return servers


# the share of the processes the tests start through the session's servers that may start plain
# before the session fails: the tests that set HOME, JAX_PLATFORMS or JAX_NUM_CPU_DEVICES on
# purpose start ~1 % plain (14 of 1,531 at stop 72); servers whose environment differs from the
# tests' start them all plain (stop 72's first try of tests/conftest.py's torch_xla start), and
# the suite then passes, at half the speed, unless something says so
PLAIN_SHARE = 0.1
PLAIN_FLOOR = 20  # a few tests run alone that set such a variable: not a session to fail


def unserved(counts: dict) -> str | None:
    """The error line for a session whose processes mostly started plain (`counts`: the servers'
    `Servers.counts()`), else None."""
    started = counts["served"] + counts["plain"]
    if counts["plain"] <= max(PLAIN_FLOOR, PLAIN_SHARE * started):
        return None
    why = "; ".join(counts["why_plain"])[:600]
    return (
        f"error: {counts['plain']} of the {started} processes the tests started through the "
        f"session's fork servers started plain ({why}): the servers' environment or interpreter "
        "differs from the tests' (tests/conftest.py, tests/preloaded.py), and the suite ran "
        "without them"
    )

"""The suite's fork servers (preload/): one per backend's set of frameworks, started by the test
session.

Each imports what its backends' processes import first; a backend or describe step the tests start
then skips 1-6 s of imports, compare itself ~0.4 s. Every server is this interpreter with the
session's environment, so a command served by one runs as a plain process would (preload/server.py
declines any other).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from preload.client import MANIFEST_ENV

REPO = Path(__file__).resolve().parents[1]
# name: (what it imports first, the modules it runs). torch_xla is preloaded too: the environment
# torch_xla_impl sets for it (its debug level, XLA's dump folder and flags, the CPU device count) is
# read when its runtime starts, not at import (measured: each set after `import torch_xla` takes
# effect), and what its import does to the environment is done again on each child's
# (preload/server.py). Not preloaded: the loader of a twin file (python -c): it checks that the file
# imports no framework, and imports none itself.
SERVERS = {
    "jax": (("numpy", "jax", "jax.numpy", "flax.nnx", "optax"), ("jax_impl",)),
    "torch": (("numpy", "torch", "torch._dynamo", "transformers"), ("torch_impl",)),
    "torchax": (
        (
            "numpy",
            "jax",
            "jax.numpy",
            "flax.nnx",
            "optax",
            "torch",
            "torch._dynamo",
            "torch.fx.experimental.symbolic_shapes",
            "torchax",
            "transformers",
        ),
        ("torchax_impl", "driver.describe_sides"),
    ),
    "torch_xla": (
        (
            "numpy",
            "torch",
            "torch._dynamo",
            "jax",
            "jax.numpy",
            "transformers",
            "torch_xla",
            "torch_xla.core.xla_model",
            "torch_xla.runtime",
            "torch_xla.distributed.spmd",
            "torch_xla.distributed.parallel_loader",
            "torch_xla.debug.metrics",
        ),
        ("torch_xla_impl",),
    ),
    # compare imports no framework, but numpy, rich, safetensors and (for its plots) matplotlib:
    # ~0.4 CPU-s of each of the suite's ~300 compare processes; its own modules are not preloaded
    # (their module state is per run)
    "compare": (
        (
            "numpy",
            "rich.console",
            "rich.live",
            "rich.progress",
            "rich.table",
            "rich.text",
            "safetensors.numpy",
            "matplotlib.figure",
            "matplotlib.backends.backend_agg",
        ),
        ("compare",),
    ),
}


def start() -> list[subprocess.Popen]:
    """The servers, started without waiting for their imports (until a socket exists, commands start
    plain), and XLA_TWINS_PRELOAD set for this process and every process it starts."""
    folder = Path(tempfile.mkdtemp(prefix="xla-twins-preload-"))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
    }
    servers, procs = [], []
    for name, (preload, routes) in SERVERS.items():
        socket_path = str(folder / f"{name}.sock")
        # what its imports leave there (torch's own temporary folder) goes with it
        own_tmp = folder / f"{name}.tmp"
        own_tmp.mkdir()
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "preload.server",
                    "--socket",
                    socket_path,
                    "--preload",
                    ",".join(preload),
                ],
                cwd=REPO,
                env={**env, "TMPDIR": str(own_tmp)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=open(folder / f"{name}.err", "w"),
            )
        )
        servers.append({"socket": socket_path, "python": sys.executable, "routes": list(routes)})
    manifest = folder / "servers.json"
    manifest.write_text(json.dumps({"servers": servers}))
    os.environ[MANIFEST_ENV] = str(manifest)
    return procs


def stop(procs: list[subprocess.Popen]) -> str:
    """The servers ended, their folder removed; returns what they served (one line)."""
    log = Path(os.environ[MANIFEST_ENV] + ".log")
    lines = log.read_text().splitlines() if log.exists() else []
    plain = [ln for ln in lines if ln.startswith("plain")]
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    shutil.rmtree(log.parent, ignore_errors=True)
    why = sorted({ln.split(": ", 1)[-1] for ln in plain})
    return (
        f"preloaded interpreters served {len(lines) - len(plain)} processes, {len(plain)} started "
        "plain" + (f" ({'; '.join(why)[:600]})" if why else "")
    )

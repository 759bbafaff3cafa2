"""Where compare keeps the backends' persistent compile caches, and the measured CPU peak beside
them.

`<root>/<cpu kind>/<backend>`: XLA builds CPU executables for the host's
vector units, and JAX's cache key names only the platform ("cpu"), so a cache
shared by machines of different CPUs (a home directory on NFS) must not hand
an AVX-512 executable to a machine without it. One folder per CPU kind.
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

import numpy as np


def default_cache_dir() -> Path:
    """Under the user's cache directory ($XDG_CACHE_HOME or ~/.cache)."""
    return (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "xla-twins"
        / "compile-cache"
    )


def peak_cache_dir() -> Path:
    """Where the measured CPU peak is kept (compare/explain/figures.py cpu_peak): the toolkit's
    cache folder, beside the compile caches and not in one, since it is the machine's, whichever
    --compile-cache a run names (a run with --no-compile-cache reads and writes no cache: it
    measures the peak)."""
    return default_cache_dir().parent


def _cpuinfo_field(name: str) -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next(
        (ln.split(":", 1)[1].strip() for ln in lines if ln.split(":")[0].strip() == name), ""
    )


def cpu_identity() -> dict:
    """This machine as a CPU peak depends on it: host, CPU model, core count, numpy."""
    return {
        "node": platform.node(),
        "machine": platform.machine(),
        "cpu_model": _cpuinfo_field("model name") or platform.processor(),
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
    }


def cpu_kind() -> str:
    """A short name for the CPU's instruction set: architecture, model and feature flags."""
    text = "|".join((platform.machine(), _cpuinfo_field("model name"), _cpuinfo_field("flags")))
    return f"{platform.machine()}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def backend_cache_dir(root: Path, backend: str) -> Path:
    return root / cpu_kind() / backend

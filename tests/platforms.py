"""The per-platform environments' pins, resolved on any machine: uv's resolver (`uv pip compile`)
reads the package index and installs nothing, so a CPU machine (CI) checks that a GPU or TPU
environment's packages install together, in about half a second each (pip's `install --dry-run
--report` gave the same pins in 30-70 s here: without the index's metadata files it fetches and
hashes every wheel, 4 GB of CUDA libraries for the GPU one).

    # write the pins resolved for this project's EXTRA
    python -m tests.platforms EXTRA CONSTRAINTS_FILE
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(extra: str) -> list[str]:
    """What this project with `extra` asks for, read from pyproject.toml."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"][extra]]


def resolve(extra: str, constraints: Path | None = None) -> dict[str, str]:
    """{package: version} that uv resolves for this project with `extra` (under `constraints`), for
    this interpreter's Python version and this platform, the project itself left out."""
    from uv import find_uv_bin

    command = [
        find_uv_bin(),
        "pip",
        "compile",
        "-",
        "--quiet",
        "--no-header",
        "--no-annotate",
        "--python-version",
        f"{sys.version_info.major}.{sys.version_info.minor}",
        *(["-c", str(constraints)] if constraints else []),
    ]
    proc = subprocess.run(
        command, input="\n".join(requirements(extra)), capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        raise RuntimeError(f"cannot resolve .[{extra}]: {' '.join(lines[-3:]) or 'no output'}")
    pins = [ln.split("#")[0].strip() for ln in proc.stdout.splitlines()]
    return {canonical(name): version for name, version in (p.split("==") for p in pins if p)}


def read_constraints(path: Path) -> dict[str, str]:
    lines = [ln.split("#")[0].strip() for ln in path.read_text().splitlines()]
    return {canonical(name): version for name, version in (ln.split("==") for ln in lines if ln)}


def write_constraints(extra: str, path: Path) -> None:
    """The pins of `extra`'s environment: the CPU environment's versions (constraints.txt, what CI
    tests) wherever the two share a package, the resolution for the platform's own packages (libtpu,
    the CUDA wheels)."""
    pins = resolve(extra, REPO / "constraints.txt")
    platform = extra.split("-")[0]  # tpu-jax -> tpu
    header = [
        f"# Exact versions of a .[{extra}] environment (make demo PLATFORM={platform} installs "
        "with -c this "
        "file).",
        f"# Regenerate: make constraints-{platform} (uv resolves them on any machine; nothing is "
        "installed).",
    ]
    path.write_text(
        "\n".join(header + [f"{name}=={version}" for name, version in sorted(pins.items())]) + "\n"
    )


if __name__ == "__main__":
    write_constraints(sys.argv[1], REPO / sys.argv[2])

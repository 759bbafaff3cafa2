"""The per-platform environments' pins, resolved by pip on any machine: `pip install --dry-run --report` installs
nothing, so a CPU machine (CI) checks that a TPU environment's packages install together.

    python -m tests.platforms EXTRA CONSTRAINTS_FILE   write the pins pip resolves for this project's EXTRA
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROJECT = "xla-twins"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(extra: str) -> list[str]:
    """What this project with `extra` asks pip for, read from pyproject.toml: resolving these, rather than the
    project itself, spares pip building the project's metadata (2-3 s a resolution)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"][extra]]


def resolve(extra: str, constraints: Path | None = None) -> dict[str, str]:
    """{package: version} that pip resolves for this project with `extra` (under `constraints`), the project
    itself left out."""
    with tempfile.TemporaryDirectory(prefix="xla-twins-resolve-") as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
                   "--report", str(report), *(["-c", str(constraints)] if constraints else []), *requirements(extra)]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")] or proc.stderr.splitlines()
            raise RuntimeError(f"pip cannot resolve .[{extra}]: {(errors or ['no output'])[-1]}")
        installs = json.loads(report.read_text())["install"]
    found = {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}
    found.pop(PROJECT, None)
    return found


def read_constraints(path: Path) -> dict[str, str]:
    lines = [ln.split("#")[0].strip() for ln in path.read_text().splitlines()]
    return {canonical(name): version for name, version in (ln.split("==") for ln in lines if ln)}


def write_constraints(extra: str, path: Path) -> None:
    """The pins of `extra`'s environment: the CPU environment's versions (constraints.txt, what CI tests) wherever
    the two share a package, pip's resolution for the platform's own packages (libtpu, the CUDA wheels)."""
    pins = resolve(extra, REPO / "constraints.txt")
    platform = extra.split("-")[0]  # tpu-jax -> tpu
    header = [f"# Exact versions of a .[{extra}] environment (make demo PLATFORM={platform} installs with -c this "
              "file).", f"# Regenerate: make constraints-{platform} (pip resolves them on any machine; nothing is "
              "installed)."]
    path.write_text("\n".join(header + [f"{name}=={version}" for name, version in sorted(pins.items())]) + "\n")


if __name__ == "__main__":
    write_constraints(sys.argv[1], REPO / sys.argv[2])

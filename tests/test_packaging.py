"""The package as a user installs it: the wheel and the sdist built from the tracked tree, every
package of the tree in the wheel, and the wheel installed (not editable) into a clean virtual
environment, where a compare runs from another folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.helpers import CACHE_HOME, REPO

# the top-level packages users were promised; tests, benchmarks and examples stay in the checkout
SHIPPED_TOPS = (
    "preload",
    "common",
    "driver",
    "analysis",
    "jax_impl",
    "torch_impl",
    "torch_xla_impl",
    "torchax_impl",
    "compare",
)


def _tree_packages() -> set[str]:
    """Every package of the checkout under the shipped tops: a folder with an __init__.py, tracked
    by git."""
    tracked = subprocess.run(
        ["git", "ls-files", *SHIPPED_TOPS], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return {str(Path(f).parent).replace("/", ".") for f in tracked if Path(f).name == "__init__.py"}


def _wheel_packages(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    return {str(Path(n).parent).replace("/", ".") for n in names if Path(n).name == "__init__.py"}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(wheel, sdist) built by `python -m build` from a copy of the tracked files: the checkout is
    never written (setuptools leaves build/ and *.egg-info beside the source)."""
    root = tmp_path_factory.mktemp("package")
    source = root / "source"
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (REPO / name).is_file():  # (a file deleted in the work tree but not yet in git's index)
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--no-isolation",
            "--wheel",
            "--sdist",
            "--outdir",
            str(root / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = (root / "dist").glob("*.whl")
    (sdist,) = (root / "dist").glob("*.tar.gz")
    return wheel, sdist


def test_the_wheel_holds_every_package_of_the_tree(built):
    wheel, sdist = built
    tree = _tree_packages()
    assert {"common.twin", "common.files", "compare.judge"} <= tree
    assert _wheel_packages(wheel) == tree, "left out of the wheel: " + str(
        tree - _wheel_packages(wheel)
    )
    assert sdist.stat().st_size > 0
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert set(project["tool"]["setuptools"]["packages"]) == {"find"}, (
        "packages are found, never listed"
    )


def test_a_package_left_out_is_found_missing(built, tmp_path):
    """The check above is not vacuous: a wheel without one room of common fails it, naming the
    room."""
    wheel, _ = built
    lean = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(lean, "w") as dst:
        for item in src.infolist():
            if not item.filename.startswith("common/twin/"):
                dst.writestr(item, src.read(item))
    assert _tree_packages() - _wheel_packages(lean) == {"common.twin"}


def _clean_venv(root: Path) -> Path:
    """A fresh virtual environment with none of the checkout in it: the frameworks come from the
    suite's environment through a path file (a plain path line: the editable install's finder is not
    run there)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120
    )
    python = root / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "suite-frameworks.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python


@pytest.mark.slow
def test_the_installed_wheel_runs_compare_from_another_folder(built, tmp_path):
    wheel, _ = built
    python = _clean_venv(tmp_path / "venv")
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--ignore-installed",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_CACHE_HOME": CACHE_HOME,
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(python), *args],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    where = run(
        "-c",
        "import common.twin, compare; from common.twin import Twin; "
        "print(common.twin.__file__); print(compare.__file__)",
    )
    assert where.returncode == 0, where.stderr[-2000:]
    assert all(line.startswith(str(tmp_path / "venv")) for line in where.stdout.split()), (
        where.stdout
    )
    helps = run("-m", "compare", "--help")
    assert helps.returncode == 0 and "--twin" in helps.stdout, helps.stderr[-2000:]
    compared = run(
        "-m",
        "compare",
        "--backend",
        "jax,torch",
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
        "--out",
        "run",
        timeout=600,
    )
    assert compared.returncode == 0, compared.stdout[-2000:] + compared.stderr[-2000:]
    report = json.loads((elsewhere / "run" / "report.json").read_text())
    assert report["status"] == "ok", report["status"]
    assert report["verdict"] == "pass" and report["backend_names"] == ["jax", "torch"]
    assert not list(REPO.glob("build")) and (REPO / "common" / "twin").is_dir()

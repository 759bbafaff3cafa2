"""The backend registry (common/backends.py): every list of backends derives from it, and a runtime
registered from outside the repository (an installed entry point) is run and judged by compare with
no other edit."""

import json
import os
import sys

import pytest

from common import backends
from tests.helpers import REPO, run_cli

# eager torch_impl copied under another name, registered only inside these tests
COPY = "torch_copy"
ROW = (
    f'BackendInfo("{COPY}", "{COPY}_impl", "torch", False, "torch-xla", "a copy of the torch '
    'runtime", '
    'frozenset({"torch_impl", "torch"}))'
)


def install_copy(site):
    """A distribution in `site` that ships the runtime's copy and declares it in the entry-point
    group."""
    package = site / f"{COPY}_impl"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    main = (REPO / "torch_impl" / "__main__.py").read_text()
    assert 'backend_main.main("torch_impl"' in main
    (package / "__main__.py").write_text(
        main.replace('backend_main.main("torch_impl"', f'backend_main.main("{COPY}_impl"')
    )
    (package / "registry.py").write_text(
        f"from common.backends import BackendInfo\n\nROW = {ROW}\n"
    )
    dist = site / f"xla_twins_{COPY}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: xla-twins-{COPY}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[{backends.ENTRY_POINT_GROUP}]\n{COPY} = {COPY}_impl.registry:ROW\n"
    )
    return site


@pytest.fixture
def registered_copy(tmp_path, monkeypatch):
    site = install_copy(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    for cached in (backends.registry, backends._installed):
        cached.cache_clear()
    yield site
    for cached in (backends.registry, backends._installed):
        cached.cache_clear()


def test_the_built_in_rows():
    assert backends.names()[:4] == ["jax", "torch", "torch_xla", "torchax"]
    assert [r.name for r in backends.BUILT_IN if r.in_both] == ["jax", "torch_xla"]
    assert [r.name for r in backends.BUILT_IN if not r.compiles] == ["torch"]
    assert backends.of_package("torch_xla_impl").flag == "torch-xla"


def test_an_installed_row_joins_every_list(registered_copy):
    from compare.__main__ import backends_of, parse_options

    assert backends.names()[-1] == COPY and backends.of_package(f"{COPY}_impl").family == "torch"
    assert backends_of("all")[-1] == COPY and backends_of("both") == ["jax", "torch_xla"]
    opts = parse_options(
        [
            "--backend",
            f"jax,{COPY}",
            f"--{COPY.replace('_', '-')}-python",
            "/opt/py",
            f"--{COPY.replace('_', '-')}-set",
            "train.lr=0.5",
        ]
    )
    assert opts.side(COPY).sets == ("train.lr=0.5",) and opts.side(COPY).python == "/opt/py"
    assert opts.describer("torch") == "/opt/py"  # its interpreter describes the torch side
    assert opts.describer("nnx") == sys.executable


@pytest.mark.parametrize(
    "field, value, why",
    [
        ("name", "Torch-Copy", "not a lowercase identifier"),
        ("family", "tf", "not one of nnx, torch"),
        ("package", "torch copy", "not a module name"),
    ],
)
def test_a_bad_row_is_refused_with_its_field(field, value, why):
    row = backends.BackendInfo(**{**vars(backends.BUILT_IN[1]), field: value})
    with pytest.raises(ValueError, match=why):
        row.check()


@pytest.mark.slow
def test_compare_runs_and_judges_a_registered_copy_with_no_other_edit(tmp_path):
    """The copy runs as its own backend: record, report row, parity against the runtime it
    copies."""
    site = install_copy(tmp_path / "site")
    out = tmp_path / "run"
    env = {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [os.environ.get("PYTHONPATH"), str(REPO), str(site)])
        )
    }
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(out),
        "--backend",
        f"torch,{COPY}",
        "--reference",
        "torch",
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "ok" and list(report["backends"]) == ["torch", COPY]
    copy = report["backends"][COPY]
    assert (
        copy["status"] == "ok"
        and json.loads((out / COPY / "record.json").read_text())["backend"] == COPY
    )
    # the same eager runtime: bitwise the same
    assert copy["losses"] == report["backends"]["torch"]["losses"]
    assert report["verdict"] == "pass" and report["parity"][COPY]["passed"] is True
    assert report["parity"][COPY]["loss"]["max_abs"] == 0.0
    # a deliberate difference on the copy's side alone is judged as one
    bad = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(tmp_path / "bad"),
        "--backend",
        f"torch,{COPY}",
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
        f"--{COPY.replace('_', '-')}-set",
        "train.lr=0.5",
        env=env,
    )
    assert bad.returncode == 1, bad.stderr[-2000:]
    bad_report = json.loads((tmp_path / "bad" / "report.json").read_text())
    assert bad_report["parity"][COPY]["passed"] is False
    assert bad_report["parity"][COPY]["intended_differences"] == [
        f"train.lr: torch=0.001 {COPY}=0.5"
    ]

"""The rules that keep the house standing: import directions, no cycles, the Python floor, one
vocabulary documented everywhere, readable output files, a clean linter, small files."""

import ast
import functools
import os
import re
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from common import backends
from common.vocab import BackendStatus, CheckpointFormat, ExitCode, ReportStatus, TraceMode

REPO = Path(__file__).resolve().parents[1]
# Our packages and what each may import, the backends' from their rows in common/backends.py.
BACKEND_ROWS = backends.BUILT_IN
PACKAGES = (
    "preload",
    "common",
    "driver",
    "analysis",
    *(r.package for r in BACKEND_ROWS),
    "compare",
    "benchmarks",
)
FRAMEWORKS = tuple(sorted({f for r in BACKEND_ROWS for f in r.frameworks} - set(PACKAGES)))
# preload (the fork server) imports the modules it preloads by name only, never at an import
# statement driver (the backend-process driver) is what backends run around their loop: compare
# never imports it
ALLOWED = {
    "preload": set(),
    "common": {"preload"},
    "driver": {"common"},
    "analysis": {"common"},
    "compare": {"common", "analysis", "preload"},  # its warm interpreters (compare/runs/warm.py)
    **{r.package: {"common", "driver", "analysis", *r.frameworks} for r in BACKEND_ROWS},
}
# common's rooms (issue 44) and the rooms each may import from: record and tensor files and file
# safety at the bottom, then the spec, the weights, a twin and its correspondence, the data (a
# twin's own batches), a step-0 capture's facts. The modules at common's top (vocab, backends, cli,
# protocol, procs, ops, sharding, presets, provoke) stand beside or above them.
COMMON_ROOMS = {
    "files": set(),
    "spec": {"files"},
    "weights": {"files", "spec"},
    "twin": {"files", "spec", "weights"},
    "data": {"files", "spec", "weights", "twin"},
    "capture": {"files"},
}
# The JAX twin's modules other JAX runtimes may use: they import jax and optax, never flax.
PLAIN_JAX = {"jax_impl.optim", "jax_impl.sharding", "jax_impl.instrument", "jax_impl.loop"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Every import statement of our modules (also those inside functions), resolved to our module
    names."""
    modules = {_module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.update(f"{node.module}.{a.name}" for a in node.names)
                targets.add(node.module)
        graph[name] = {
            t if t in modules else t.rsplit(".", 1)[0] if t.rsplit(".", 1)[0] in modules else t
            for t in targets
        }
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph or state.get(nxt) == 2:
                continue
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            found = visit(nxt)
            if found:
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_module_import_graph_is_acyclic():
    graph = import_graph()
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_every_import_of_our_packages_exists():
    """Also imports inside functions, which run only on some paths (a moved module breaks them
    late)."""
    graph = import_graph()
    missing = []
    for module, targets in graph.items():
        for target in targets:
            if target.split(".")[0] not in PACKAGES or target in graph:
                continue
            # `from parent import name`: defined in parent?
            parent, _, name = target.rpartition(".")
            init = REPO / parent.replace(".", "/") / "__init__.py"
            source = init if init.exists() else REPO / (parent.replace(".", "/") + ".py")
            defined = rf"^(def|class) {name}\b|^{name}\b.*=|^(from|import) .*\b{name}\b"
            if parent not in graph or not re.search(defined, source.read_text(), re.M):
                missing.append(f"{module} imports {target}")
    assert not missing, missing


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"numpy"}}) is None


def test_packages_import_only_what_they_run_on():
    bad = []
    for module, targets in import_graph().items():
        package = module.split(".")[0]
        if package not in ALLOWED:
            continue
        for target in targets:
            top = target.split(".")[0]
            if (
                (top in PACKAGES or top in FRAMEWORKS)
                and top != package
                and top not in ALLOWED[package]
            ):
                bad.append(f"{module} imports {target}")
    assert not bad, bad


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return (
        parts[1] if parts[0] == "common" and len(parts) > 1 and parts[1] in COMMON_ROOMS else None
    )


def test_commons_rooms_import_only_the_rooms_below_them():
    graph = import_graph()
    assert {room_of(m) for m in graph} >= set(COMMON_ROOMS)  # every room is there
    bad = []
    for module, targets in graph.items():
        room = room_of(module)
        for target in [t for t in targets if room and t.split(".")[0] == "common"]:
            allowed = (
                target in ("common.vocab", "common.procs")
                if room_of(target) is None
                else room_of(target) in (room, *COMMON_ROOMS[room])
            )
            if not allowed:
                bad.append(f"{module} imports {target}")
    assert not bad, bad


def test_compares_judge_imports_nothing_from_the_runs_or_the_report():
    """compare/ is layered: runs/ starts the backends, judge/ judges what they wrote, reporting/
    builds the report from both; judging never reaches back up into them."""
    graph = import_graph()
    bad = [
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module.startswith("compare.judge")
        for target in targets
        if target.startswith(("compare.runs", "compare.reporting", "compare.__main__"))
    ]
    assert not bad, bad


def test_compare_is_layered_with_no_arrow_back_up():
    """compare/'s rooms, lowest first: judge/ (what a run's files say), runs/ (the backends' runs,
    and the extra runs a judgement asks for), explain/ (why they differ), reporting/ (the report);
    no room imports one above it."""
    layers = ["compare.judge", "compare.runs", "compare.explain", "compare.reporting"]

    def layer(module: str) -> int | None:
        return next((i for i, room in enumerate(layers) if module.startswith(room)), None)

    graph = import_graph()
    bad = [
        f"{module} imports {target}"
        for module, targets in graph.items()
        if layer(module) is not None
        for target in targets
        if layer(target) is not None and layer(target) > layer(module)
    ]
    assert not bad, bad


def test_the_report_is_built_once_per_run_from_its_last_judgement():
    """compare judges a run again after each extra run (compare/judge/judgement.py: typed), and
    builds report.json once, from the last judgement: one call of report_of in compare's run, and
    nothing under runs/ or judge/ reads a report."""
    calls = []
    for path in sorted((REPO / "compare").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "report_of":
                calls.append(path.relative_to(REPO).as_posix())
    assert calls == ["compare/__main__.py", "compare/reporting/report.py"]  # and build_report's
    readers = [
        f"{path.relative_to(REPO)}:{n}"
        for room in ("runs", "judge")
        for path in sorted((REPO / "compare" / room).glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\breport(\[|\.get\(|: dict)", line)
    ]
    assert not readers, readers


def test_other_runtimes_use_only_the_plain_jax_modules_of_the_jax_twin():
    graph = import_graph()
    used = {
        t.rsplit(".", 1)[0] if t not in graph else t
        for m, ts in graph.items()
        if m.startswith("torchax_impl")
        for t in ts
        if t.startswith("jax_impl")
    }
    assert used and used <= PLAIN_JAX | {"jax_impl"}, used
    for module in PLAIN_JAX:
        assert not any(t.split(".")[0] == "flax" for t in graph[module]), module


# torchax_impl's own modules never import flax (the static test above); torchax itself may: the
# torchax 0.0.13 that fresh installs here get imports flax.training in its checkpoint helpers.
@pytest.mark.parametrize(
    "module, absent",
    [
        ("torch_impl.train", ("torch_xla", "jax", "flax")),
        ("torchax_impl.train", ("torch_xla",)),
        ("jax_impl.train", ("torch", "torch_xla")),
    ],
)
def test_a_backend_loads_only_what_it_runs_on(module, absent):
    code = f"import sys, {module}; print(','.join(m for m in {absent!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ""


def test_importing_common_leaves_frameworks_out():
    code = (
        "import sys, common, common.spec, common.presets, common.weights, common.data, "
        "common.sharding, "
        "common.files.record, common.files.fsutil, common.vocab, common.cli, driver.backend_main, "
        "driver.harness, "
        "driver.describe_sides, driver.process\n"
        "from common.data import make_dataset\nfrom common.presets import load_spec\n"
        "make_dataset(load_spec('cnn-digits')).global_batch(0)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r})\n"
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""


def test_python_floor_is_311_everywhere():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["requires-python"] == ">=3.11"
    assert project["tool"]["ruff"]["target-version"] == "py311"
    readme = (REPO / "README.md").read_text()
    assert "3.11+" in readme and "3.10" not in readme
    assert sys.version_info >= (3, 11)


def test_every_vocabulary_member_is_documented():
    readme, errors = (REPO / "README.md").read_text(), (REPO / "docs" / "errors.md").read_text()
    for code in ExitCode:  # a table row "| 2 | ..." in both
        for doc, where in ((readme, "README.md"), (errors, "docs/errors.md")):
            assert re.search(rf"^\| {int(code)} \|", doc, re.M), (
                f"exit code {int(code)} missing from {where}"
            )
    for member in (*BackendStatus, *ReportStatus):
        assert f"`{member.value}`" in errors, f"status {member.value} missing from docs/errors.md"
    for mode in TraceMode:
        assert f"`{mode.value}`" in readme, f"trace mode {mode.value} missing from README.md"
    for fmt in CheckpointFormat:  # `hf:`, `torch:` ... as the README shows them
        assert f"`{fmt.value}:`" in readme, f"checkpoint format {fmt.value} missing from README.md"


def documented_error_cases() -> list[str]:
    """The id of every case row in docs/errors.md (a table whose first column is `id`)."""
    ids, in_case_table = [], False
    for line in (REPO / "docs" / "errors.md").read_text().splitlines():
        if line.startswith("| id |"):
            in_case_table = True
        elif not line.startswith("|"):
            in_case_table = False
        elif in_case_table and not line.startswith("|---"):
            ids.append(re.match(r"\| `([a-z0-9-]+)` \|", line).group(1))
    return ids


def error_cases_in_tests() -> dict[str, list[str]]:
    """id -> the tests that name it in `pytest.mark.error_case(...)` (on the test or on one of its
    params)."""
    tested = {}
    for path in sorted((REPO / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "error_case":
                for arg in node.args:
                    tested.setdefault(arg.value, []).append(path.name)
    return tested


def test_every_documented_error_case_has_a_test():
    documented, tested = documented_error_cases(), error_cases_in_tests()
    assert len(documented) == len(set(documented)) > 60, "a case id is used twice in docs/errors.md"
    untested = [case for case in documented if case not in tested]
    assert not untested, (
        f"docs/errors.md cases no test names with pytest.mark.error_case: {untested}"
    )
    undocumented = sorted(set(tested) - set(documented))
    assert not undocumented, (
        f"error_case ids the tests name that docs/errors.md lacks: {undocumented}"
    )


def test_atomic_writes_keep_the_umask_permissions(tmp_path):
    from common.files.fsutil import write_json_atomic
    from common.files.tensor_file import write_tensors
    from common.weights import save_checkpoint

    old = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "report.json", {"a": 1})
        write_tensors(tmp_path, {"outputs": {"loss": np.zeros(())}})
        save_checkpoint(tmp_path / "ckpt.safetensors", {"w": np.zeros((2, 2), np.float32)})
        os.umask(0o077)
        write_json_atomic(tmp_path / "private.json", {"a": 1})
    finally:
        os.umask(old)
    for name in ("report.json", "tensors.npz", "ckpt.safetensors"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name
    assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600


def test_ruff_is_clean():
    ruff = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert ruff.returncode == 0, ruff.stdout[-3000:] + ruff.stderr[-1000:]


# Functions over FUNCTION_LINES lines (as `ruff format` lays them out at 100 columns), each to be
# split by job: the list may only shrink. One growing past the bound, or its length here, fails
FUNCTION_LINES = 100
LONG_FUNCTIONS = {
    # one add_argument call per flag: to split by flag group
    "compare/__main__.py:build_parser": 145,
    "compare/__main__.py:compare": 134,
    "compare/reporting/render.py:parity_tables": 158,
    "compare/reporting/render.py:backend_tables": 104,
    "compare/judge/parity.py:check_parity": 132,
    "compare/judge/messages.py:failure_message": 113,
    "compare/runs/orchestrate.py:run_backend": 103,
    "torch_impl/capture.py:capture_activations": 118,
    "driver/process.py:backend_parser": 102,
    "benchmarks/tables.py:print_all": 159,
    "benchmarks/__main__.py:main": 124,
}


def test_functions_stay_small():
    """The house's size rule is on functions (files are split by job, DESIGN.md): none over
    FUNCTION_LINES lines but those listed, and none of those longer than listed."""
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > FUNCTION_LINES:
                        found[f"{path.relative_to(REPO)}:{node.name}"] = lines
    grown = {k: n for k, n in found.items() if n > LONG_FUNCTIONS.get(k, FUNCTION_LINES)}
    assert not grown, f"functions over {FUNCTION_LINES} lines (or longer than listed): {grown}"


def test_the_tree_is_formatted():
    """`ruff format` at 100 columns over the whole tree, as CI checks it."""
    ruff = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert ruff.returncode == 0, ruff.stdout[-3000:] + ruff.stderr[-1000:]


def test_every_registered_backend_is_a_package_we_ship_and_document():
    """A row of common/backends.py is a shipped package whose `python -m` runs the shared driver
    under its own name, installed by the extra the row names, and listed in the README's table of
    backends."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    # (tests/test_packaging.py: the wheel)
    found = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {
        "preload",
        "common",
        "driver",
        "analysis",
        "compare",
        *(r.package for r in BACKEND_ROWS),
    } <= set(found)
    readme = (REPO / "README.md").read_text()
    for row in BACKEND_ROWS:
        main = (REPO / row.package / "__main__.py").read_text()
        assert re.search(rf'backend_main\.main\(\s*"{row.package}"', main), row.name
        assert row.extra in project["project"]["optional-dependencies"], row.name
        assert re.search(rf"^\| `{row.name}` \|.*\| `{row.package}` \|$", readme, re.M), (
            f"{row.name} not in README"
        )


# jax_impl and torch_impl (the two twins) have these modules alike, each doing the same job with the
# same names
MIRRORED = (
    "models",
    "convert",
    "capture",
    "describe",
    "masks",
    "optim",
    "checkpoint_io",
    "export",
    "train",
)


def test_the_twins_mirror_file_for_file():
    missing = [
        f"{pkg}/{m}.py"
        for m in MIRRORED
        for pkg in ("jax_impl", "torch_impl")
        if not (REPO / pkg / f"{m}.py").exists()
    ]
    assert not missing, missing
    layout = (REPO / "docs" / "reference" / "layout.md").read_text()  # the README's Layout, moved
    assert all(f"`{m}`" in layout.split("The twins mirror each other")[1][:400] for m in MIRRORED)


def test_every_trainer_implements_the_harness_runtime_with_the_same_signatures():
    """Each backend's `<package>.train.make_trainer` builds a driver.harness.Runtime: the methods
    the harness calls, with the same parameters on every backend (the benchmarks time the same
    `timed_step`)."""
    import importlib
    import inspect
    import typing

    from driver.harness import Runtime

    methods = {
        name: list(inspect.signature(f).parameters)
        for name, f in vars(Runtime).items()
        if inspect.isfunction(f) and not name.startswith("_")
    }
    assert {"timed_step", "step0_tensors", "batches", "after_loop", "analyse", "new_record"} <= set(
        methods
    )
    for row in BACKEND_ROWS:
        module = importlib.import_module(f"{row.package}.train")
        trainer = typing.get_type_hints(module.make_trainer)["return"]
        for name, parameters in methods.items():
            assert list(inspect.signature(getattr(trainer, name)).parameters) == parameters, (
                row.name,
                name,
            )
        assert isinstance(trainer.captures_after_run, bool), row.name


def test_every_path_to_the_checkout_is_the_checkout():
    """A module that finds the checkout from its own file (`Path(__file__).resolve().parents[N]`)
    finds this one: a module moved into a room one level deeper keeps its N right."""
    found = []
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            for n in re.findall(
                r"Path\(__file__\)\.resolve\(\)\.parents\[(\d)\]", path.read_text()
            ):
                found.append((path.relative_to(REPO), path.resolve().parents[int(n)]))
    assert len(found) >= 2 and all(root == REPO.resolve() for _, root in found), found


def test_make_test_runs_a_process_per_core_and_one_more_as_the_memory_holds(monkeypatch):
    from tests import workers

    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(workers, "available_gib", lambda: 64.0)
    assert workers.count() == min(cores + 1, 64 // workers.GIB_PER_PROCESS)
    monkeypatch.setattr(workers, "available_gib", lambda: 7.9)
    assert workers.count() == min(cores + 1, 2)
    monkeypatch.setattr(workers, "available_gib", lambda: 1.0)
    assert workers.count() == 1
    assert "TEST_PROCESSES ?= $(shell python3 -m tests.workers)" in (REPO / "Makefile").read_text()

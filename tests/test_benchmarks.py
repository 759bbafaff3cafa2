"""`python -m benchmarks` end to end on one preset (few rounds): every figure the issue asks for is
measured and lands in the JSON. Timing targets are judged by the benchmark's output, not here."""

import json

import pytest

from tests.helpers import run_cli

# It runs beside the other tests (make test's processes share two cores): it checks that every
# figure is measured, with bounds no contention reaches (a candidate that skipped its work reads
# ~0); the targets are judged by `python -m benchmarks` run alone.
pytestmark = pytest.mark.slow


def test_benchmark_measures_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_cli(
        "benchmarks",
        "--presets",
        "mlp-tiny",
        "--rounds",
        "2",
        "--repeats",
        "1",
        "--out",
        str(out),
        # a small user twin
        "--twins",
        "tests/data/user_project/twins.py:net",
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["failures"] == []
    overhead = {r["backend"]: r for r in result["overhead"] if r["spec"] == "mlp-tiny"}
    assert set(overhead) == {"jax", "torch_xla", "torch", "torchax"}
    twin = {r["backend"]: r for r in result["overhead"] if r["spec"] == "net"}  # through --twins
    assert set(twin) == set(overhead)
    for r in [*overhead.values(), *twin.values()]:
        assert r["compiles_while_timed"] == 0  # every candidate was compiled before the clock
        for name in ("toolkit_over_minimal", "instrumented_over_uninstrumented"):
            # a sanity bound (a candidate that skipped its work reads ~0), not the target: a few
            # rounds on two shared cores read 0.39 once for eager torch's mlp-tiny while another
            # process ran (1.06 alone)
            assert 0.1 < r["ratios"][name]["median"] < 10 and r["ratios"][name]["n"] == 2
    assert set(overhead["torch_xla"]["step_ms"]) == {"minimal", "toolkit", "uninstrumented"}
    (modes,) = result["trace_mode_steps"]
    assert (
        set(modes["step_ms"]) == {"lazy", "compile", "dynamo"}
        and modes["compiles_while_timed"] == 0
    )
    assert 0 < modes["tracing_ms"]["lazy"]["share_of_step"] < 1
    run = result["runs"]["mlp-tiny"]
    assert run["verdict"] == "pass" and 1 < run["wall_over_frameworks"]["median"] < 5
    for backend in ("jax", "torch_xla"):
        b = run["backends"][backend]
        assert b["steady_state_recompiles"]["median"] == 0
        # MFU is over a matmul peak measured on this shared machine: measured while another process
        # held a core it reads low, and the MFU of a step timed alone reads above 1 (1.5 seen beside
        # the suite)
        assert 0 < b["mfu"]["median"] < 10 and b["peak_rss_mb"]["median"] > 100
        assert (
            b["step_ms"]["median"] > 0
            and b["pipelined_ms"]["median"] > 0
            and b["compile_s"]["median"] > 0
        )
    for mode in ("compile", "dynamo"):
        assert result["trace_modes"]["mlp-tiny"][mode]["steady_state_recompiles"]["median"] == 0
    # `--twin` on jax,torch: its describing counted with the frameworks'
    twin_run = result["runs"]["twin net"]
    assert twin_run["verdict"] == "pass" and 1 < twin_run["wall_over_frameworks"]["median"] < 5
    checked = [c["what"] for c in result["checks"]]
    # 4 backends x (mlp-tiny, llama_tiny)
    assert sum("toolkit_over_minimal" in c for c in checked) == 8
    # mlp-tiny's 2 + 2 trace modes, the twin's 2
    assert sum("steady-state recompiles" in c for c in checked) == 6
    assert sum("`--twin` compare of net" in c for c in checked) == 1
    # compare's process imports no framework; the backends' mostly frameworks
    imports = result["imports"]
    assert imports["compare"]["frameworks"] == 0 and imports["compare"]["toolkit"] > 0
    # beside the suite's other processes jax's read 4.5x (alone ~6x)
    for backend in ("jax", "torch_xla"):
        assert imports[backend]["frameworks"] > 2 * imports[backend]["toolkit"] > 0
    for table in (
        "Train step, interleaved",
        "torch_xla trace modes",
        "Whole runs",
        "Import time per process",
        "Targets",
    ):
        assert table in proc.stdout

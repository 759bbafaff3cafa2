"""Units behind the performance figures: HLO flops over several graphs, which graphs a step runs,
the wall-time breakdown, the benchmark's repeat and ratio arithmetic, and how a framework process
ends."""

import subprocess
import sys

import pytest

from analysis.hlo import matmul_flops
from benchmarks.runs import summarize_repeats
from benchmarks.timing import ratio, spread, summarize
from common.files.record import CompileEvent, RunRecord, peak_rss_mb
from compare.explain.figures import wall_breakdown
from tests.helpers import REPO

MODULE = """HloModule {name}

ENTRY main {{
  %a = f32[{m},{k}]{{1,0}} parameter(0)
  %b = f32[{k},{n}]{{1,0}} parameter(1)
  ROOT %dot = f32[{m},{n}]{{1,0}} dot(%a, %b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}
"""  # noqa: E501 (HLO text as XLA writes it)


def test_matmul_flops_adds_modules_whose_instruction_names_repeat():
    forward = MODULE.format(name="fwd", m=8, k=16, n=4)
    backward = MODULE.format(name="bwd", m=32, k=2, n=8)
    assert matmul_flops(forward) == 2 * 8 * 16 * 4
    assert matmul_flops(backward) == 2 * 32 * 2 * 8
    assert matmul_flops(forward + "\n" + backward) == 2 * 8 * 16 * 4 + 2 * 32 * 2 * 8


def _events(*steps):
    return [CompileEvent("g", 1.0, s, "setup" if s < 0 else "loop") for s in steps]


CONVS = """HloModule convs

ENTRY main {
  %x = f32[64,8,8,16]{3,2,1,0} parameter(0)
  %w = f32[3,3,16,32]{3,2,1,0} parameter(1)
  %dy = f32[64,4,4,32]{3,2,1,0} parameter(2)
  %wt = f32[3,3,32,16]{3,2,1,0} parameter(3)
  %y = f32[64,4,4,32]{3,2,1,0} convolution(%x, %w), window={size=3x3 stride=2x2 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  ROOT %dx = f32[64,8,8,16]{3,2,1,0} convolution(%dy, %wt), window={size=3x3 pad=1_2x1_2 lhs_dilate=2x2}, DIMS
}
""".replace("DIMS", "dim_labels=b01f_01io->b01f")  # noqa: E501 (HLO text)


def test_conv_flops_count_useful_work_only():
    """A stride-2 conv and its input gradient do the same multiply-adds; the gradient's lhs_dilate
    zeros are not work (the count of the cnn-digits step then equals torch's FlopCounterMode: tested
    end to end)."""
    forward = 2 * (64 * 4 * 4 * 32) * (3 * 3 * 16)
    assert (
        matmul_flops(CONVS) == forward + (2 * (64 * 8 * 8 * 16) * (3 * 3 * 32)) / 4 == 2 * forward
    )


def test_step_graphs_lazy_takes_the_settled_graph_and_dynamo_adds_forward_and_backward():
    from torch_xla_impl.instrument import step_graphs

    # lazy: parity graph in setup, step 0 (the optimizer state made before it: the settled step)
    assert step_graphs(_events(-1, -1, 0), 1, "lazy") == [2]
    # a step 1 that compiled again (state created by step 0): the graph it settled on
    assert step_graphs(_events(-1, 0, 1), 2, "lazy") == [2]
    assert step_graphs(_events(0, 1), 2, "compile") == [1]
    # dynamo: forward, a tiny graph, backward, first optimizer step at step 0; settled optimizer at
    # step 1
    assert step_graphs(_events(-1, 0, 0, 0, 0, 1), 2, "dynamo") == [1, 2, 3, 5]
    # no state to create: nothing at step 1
    assert step_graphs(_events(0, 0, 0), 2, "dynamo") == [0, 1, 2]
    # every graph of the settled step 0
    assert step_graphs(_events(-1, 0, 0, 0, 0), 1, "dynamo") == [1, 2, 3, 4]


def test_wall_breakdown_parts_add_up_to_the_process_wall_time():
    record = RunRecord(backend="jax", spec={"model": {}})
    record.compile_events = [CompileEvent("a", 0.5, -1, "setup"), CompileEvent("b", 1.5, 0, "loop")]
    record.timeline = {"ready": 102.0, "loop_start": 104.0, "loop_end": 110.0}
    parts = wall_breakdown(record, started_at=100.0, wall_s=12.0)
    assert parts == {
        "start_and_imports_s": 2.0,
        "compile_s": 2.0,
        "steps_s": 4.5,
        "other_s": 3.5,
        "total_s": 12.0,
    }
    # a reused record: no launch time
    assert wall_breakdown(record, started_at=None, wall_s=12.0) is None
    # a run its describe step's process made: the imports were paid there, the cell says so and for
    # how long
    handed = wall_breakdown(record, started_at=100.0, wall_s=12.0, described_at=93.5)
    assert handed == {**parts, "described_s": 6.5}
    # report.md's "interpreter start + imports (s)" cell
    from compare.reporting.render import _imports

    assert (_imports(handed), _imports(parts)) == (
        "2.00 (paid describing: that process had run 6.50 s)",
        "2.00",
    )


def test_repeats_are_summarized_leaf_by_leaf():
    runs = [
        {"wall": 3.0, "b": {"ms": 1.0, "mode": "lazy"}},
        {"wall": 1.0, "b": {"ms": 2.0, "mode": "lazy"}},
        {"wall": 2.0, "b": {"ms": 4.0, "mode": "lazy"}},
    ]
    out = summarize_repeats(runs)
    assert out["wall"] == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert out["b"]["ms"]["median"] == 2.0 and out["b"]["mode"] == "lazy"


def test_ratios_are_taken_round_by_round():
    samples = {"a": [[2.0, 2.0, 9.0], [4.0, 4.0, 4.0]], "b": [[1.0, 1.0, 1.0], [4.0, 4.0, 4.0]]}
    assert summarize(samples)["a"] == spread([2.0, 4.0])
    assert ratio(samples, "a", "b") == {"median": 1.5, "min": 1.0, "max": 2.0, "n": 2}


def test_peak_rss_is_this_process_in_mib():
    import numpy as np

    before = peak_rss_mb()
    block = np.ones(64 * 2**20 // 8)  # 64 MiB touched
    assert peak_rss_mb() >= before and peak_rss_mb() > 64
    del block
    assert 10 < before < 100_000


@pytest.mark.error_case("cpu-peak-stale")
def test_an_unreadable_or_stale_cached_cpu_peak_is_measured_again_and_replaced(tmp_path):
    import json

    from compare.explain.figures import CPU_PEAK_FILE, CPU_PEAK_SOURCE, cpu_peak
    from compare.runs.cache import cpu_identity

    path = tmp_path / CPU_PEAK_FILE
    path.write_text('{"identity": {"node"')  # truncated
    flops, source = cpu_peak(tmp_path)
    saved = json.loads(path.read_text())
    assert flops > 0 and source == CPU_PEAK_SOURCE and saved["identity"] == cpu_identity()
    assert saved["flops"] == flops
    path.write_text(
        json.dumps({**saved, "identity": {**saved["identity"], "cpu_count": 4096}, "flops": 1e30})
    )
    flops, source = cpu_peak(tmp_path)  # another machine's peak is never used
    assert (
        flops < 1e30
        and source == CPU_PEAK_SOURCE
        and json.loads(path.read_text())["identity"] == cpu_identity()
    )
    # measured while the CPU was busy
    path.write_text(json.dumps({**json.loads(path.read_text()), "flops": 1.0}))
    flops, source = cpu_peak(tmp_path)  # this run's look reads more: it replaces the cached peak
    assert (
        flops > 1.0 and source == CPU_PEAK_SOURCE and json.loads(path.read_text())["flops"] == flops
    )


def _ended(body: str) -> subprocess.CompletedProcess:
    """A plain Python process (no framework but what `body` imports) that ends through
    common.procs.exit_process."""
    code = f"import atexit, threading, time\nfrom common.procs import exit_process\n{body}"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_exit_process_runs_the_exit_hooks_flushes_and_keeps_the_exit_code():
    proc = _ended(
        "atexit.register(lambda: print('hook ran'))\nprint('written', end='')\n"
        "sys_err = __import__('sys').stderr\nprint('warned', file=sys_err, end='')\nexit_process(3)"
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "writtenhook ran\n", "warned")


def test_exit_process_waits_for_a_thread_still_working():
    proc = _ended(
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread done'))).start()\n"
        "exit_process(4)"
    )
    assert (proc.returncode, proc.stdout) == (4, "thread done\n")


@pytest.mark.slow  # two interpreters import JAX (~3 CPU-s): make test, not make test-fast
def test_exit_process_skips_jaxs_cache_clearing_hook_unless_jax_distributed_runs():
    """JAX's exit hook clears its caches and clients (0.05-0.15 s after a run): os._exit frees them.
    A process in a jax.distributed run keeps it: its shutdown is what the other processes wait on.
    Seen through the functions the hook calls, replaced by ones that say so."""
    hooked = (
        "import types, jax, jax._src.api as api, jax._src.distributed as distributed\n"
        "api.clear_caches = lambda: print('cleared')\n"
        "atexit.register(lambda: print('hook ran'))\n"
    )
    alone = _ended(hooked + "exit_process(0)")
    assert (alone.returncode, alone.stdout) == (0, "hook ran\n"), alone.stderr[-2000:]
    joined = _ended(
        hooked
        + "distributed.global_state.client = types.SimpleNamespace(shutdown=lambda: print('shut'))"
        + "\nexit_process(0)"
    )
    assert (joined.returncode, joined.stdout) == (0, "hook ran\ncleared\nshut\n"), joined.stderr


def test_the_pipelined_throughput_times_the_runs_steps_up_to_ten_unless_told():
    """A run of 50 steps timed 50 more for its pipelined figure; 10 read it as well (measured:
    docs/performance.md). --throughput-steps N is N whatever the run's steps, 0 none."""
    from common.files.record import PIPELINED_STEPS, pipelined_steps
    from common.presets import load_spec

    spec = load_spec("gpt-tiny")
    assert spec.train.steps == 50 and PIPELINED_STEPS == 10
    assert pipelined_steps(spec, None) == 10
    short = load_spec("gpt-tiny", ["train.steps=3"])
    assert pipelined_steps(short, None) == 3
    assert pipelined_steps(spec, 0) == 0 and pipelined_steps(short, 30) == 30


def test_a_cpu_peak_look_times_one_product_at_least_however_short():
    """A run's look at the peak is 0.02 s: a process paused past its end (a busy machine) timed no
    product and read 0, and a cached peak measured while busy was then never raised."""
    from compare.explain.figures import measured_cpu_peak

    assert measured_cpu_peak(0.0) > 1e6  # flop/s: one 1024^3 product timed

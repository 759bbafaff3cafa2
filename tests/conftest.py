"""Process-wide setup of the test session.

PyTorch's autograd engine sizes its per-device queues at the first backward of a process, and
torch_xla counts XLA devices once its runtime has started. Tests in this process run backwards on
the CPU (the Hugging Face reference, the twins) and on XLA (tests/test_torch_xla_units.py): when a
CPU backward came first, the XLA one failed an internal assert of the engine (measured). Starting
torch_xla's CPU runtime before any test, where torch_xla is installed and a process may run those
tests, makes the order not matter.
"""

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

# One OpenMP thread in this process and in every process it starts: `make test` runs two test
# processes on two cores, and eager torch's default two OpenMP threads, spinning against the other
# process's work, took 2.5x as long as one thread (two gpt-tiny runs side by side: 10.8 s vs 4.4 s;
# 43 s instead of 4 s seen in the suite). Set before torch is imported, so that this process and its
# subprocesses compute alike.
os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402

from common import backends  # noqa: E402
from preload.servers import served_line  # noqa: E402
from tests import (
    helpers,  # noqa: E402, F401  (the suite's compile cache, made here for every test process)
    preloaded,  # noqa: E402
)

TORCH_XLA = importlib.util.find_spec("torch_xla") is not None
if TORCH_XLA:
    os.environ.setdefault("PJRT_DEVICE", "CPU")


def _may_run_torch_xla_in_process(config) -> bool:
    """Whether the session may run tests/test_torch_xla_units.py (slow: torch_xla's runtime in the
    test's own process): not with the slow tests deselected, where torch_xla's import, ~5 CPU-s a
    process, was spent for nothing. Otherwise every process of the session starts it, pytest-xdist's
    controller too: its import sets variables (TF_CPP_MIN_LOG_LEVEL, GRPC_VERBOSITY) that the
    controller's fork servers must share with the test processes, or every process those start
    differs from its server and starts plain (measured: the whole suite then ran unserved)."""
    return not _slow_deselected(config)


def _slow_deselected(config) -> bool:
    """`make test-fast`'s session: the slow tests deselected (`-m 'not slow'`)."""
    return "not slow" in (config.option.markexpr or "")


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """The test modules' assertion rewrites kept beside their bytecode (tests/__pycache__, as
    `make`'s compileall keeps the rest): pytest writes them only where bytecode may be written, and
    the developers' and CI's machines set PYTHONDONTWRITEBYTECODE=1, so every test process rewrote
    every test module again (~4 CPU-s of a process's collection, measured)."""
    may_write, sys.dont_write_bytecode = sys.dont_write_bytecode, False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = may_write


# its sitecustomize refuses backend processes
NO_BACKENDS = Path(__file__).resolve().parent / "no_backends"


def pytest_configure(config):
    """Deselecting the slow tests (`make test-fast`) promises no backend process: every process the
    tests start imports tests/no_backends/sitecustomize.py first, which refuses to run one and notes
    it. Otherwise the session's fork servers (tests/preloaded.py) start the backend processes with
    their frameworks imported. A worker of `-n` inherits the controller's guard or servers."""
    if TORCH_XLA and _may_run_torch_xla_in_process(config):
        import torch_xla

        torch_xla.device()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    helpers.bound_kept_cache()
    if not _slow_deselected(config):
        # 0: every process a fresh interpreter
        if os.environ.get("XLA_TWINS_TEST_PRELOAD", "1") != "0":
            config.preload_servers = preloaded.start()
        return
    fd, log = tempfile.mkstemp(prefix="xla-twins-backend-guard-")
    os.close(fd)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(NO_BACKENDS), os.environ.get("PYTHONPATH")])
    )
    os.environ["XLA_TWINS_BACKEND_GUARD"] = log
    os.environ["XLA_TWINS_BACKEND_GUARD_PACKAGES"] = ",".join(backends.packages())
    # no backend, so no warm interpreter of one either (compare/runs/warm.py)
    os.environ[preloaded.MANIFEST_ENV] = preloaded.OFF
    config.backend_guard_log = Path(log)


# runs that one test makes and another reads (shared_runs below): the maker goes first and the
# readers last, or a reader waits on the maker in another test process (seen: 99 s, the maker had
# been queued behind others)
READ_AGAIN = ("resnet_run",)
# the longest tests (60-190 s each beside the others, measured in `make test`) start first: one of
# them started late keeps its test process running after the others have ended, a core idle
LONGEST = (
    "test_benchmark_measures_every_figure",
    "test_dropout_runs_on_every_backend_and_passes_statistically",
    "test_three_provoked_causes_are_named_alike_on_every_compiling_backend",
    "test_llama_twin_passes_single_device_and_on_a_mesh",
    "test_hugging_faces_qwen2_passes_on_every_backend_from_save_pretrained",
    "test_exact_mode_feeds_every_backend_the_same_masks_and_agrees_within_fp32",
    "test_bfloat16_runs_are_compared_under_the_bf16_policy_and_as_distributions",
    "test_hugging_faces_bert_passes_in_float64_on_torchax_after_its_module_capture",
    "test_gpt_tiny_in_float64_agrees_to_float64_rounding_on_every_runtime",
    "test_a_model_loaded_in_bfloat16_trains_in_bfloat16_and_is_judged_by_its_own_floor",
    "test_hugging_faces_llama_decodes_as_its_nnx_port_on_every_runtime",
    "test_the_unet_denoiser_passes_fed_its_own_batches",
    "test_two_processes_match_one_process",
    "test_hugging_faces_gpt2_passes_from_hf_on_every_backend_with_no_layout_declared",
    "test_the_fused_rms_norm_runs_in_float64_and_flash_attention_is_said_not_to",
    "test_flash_attention_in_bfloat16_is_judged_by_its_floor_and_a_missing_scale_named",
    "test_flash_attention_passes_in_float32_and_a_mask_one_block_ahead_is_named",
    "test_a_psum_left_out_over_the_wrong_axis_or_from_the_wrong_rank_is_named",
    "test_hugging_faces_qwen2_decodes_16_tokens_as_its_nnx_port_in_float32",
    "test_the_decoder_passes_per_device_against_four_gloo_ranks",
)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config, items):
    """A test that reads the shared finished run needs a backend to have run: it is slow. The makers
    of shared runs and the longest tests go first, the other slow tests next, so that the test
    processes end together on short tests rather than one waiting on a long one; the readers of a
    shared run go last."""
    made, order = set(), {}
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "finished_run" in fixtures:
            item.add_marker(pytest.mark.slow)
        shared = {name for name in READ_AGAIN if name in fixtures}
        order[item.nodeid] = _rank(item, makes=bool(shared - made), reads=bool(shared))
        made |= shared
    items.sort(key=lambda item: order[item.nodeid])  # stable: files keep their order


def _rank(item, makes: bool, reads: bool) -> int:
    """Where a test goes: a shared run's maker, the longest, the other slow tests, the fast ones,
    its readers."""
    if makes:
        return 0
    if reads:
        return 4
    if getattr(item, "originalname", item.name) in LONGEST:
        return 1
    return 2 if item.get_closest_marker("slow") else 3


@pytest.fixture(autouse=True)
def _environment_as_the_session_set_it():
    """Every test starts from the session's environment. A framework a test imports in its own
    process can set variables there (scikit-learn's and joblib's KMP_* for OpenMP, JAX's Mosaic GPU
    paths), and every process a later test of that test process started carried them: its
    environment then differed from the fork servers' and it started as a fresh interpreter, its
    framework imported again (124 of the suite's 1,275 processes at stop 67)."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
    """`shared_runs(name, make)`: the folder in which `make(folder)` ran once for the whole session,
    whichever test process asked first (pytest-xdist's workers share their basetemp's parent; the
    others wait on a lock and read the same folder). Module fixtures would run once per worker
    instead."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-runs"
    root.mkdir(exist_ok=True)

    def run_once(name: str, make) -> Path:
        folder, done = root / name, root / f"{name}.done"
        with FileLock(str(root / f"{name}.lock")):
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                make(folder)
                done.touch()
        return folder

    return run_once


@pytest.fixture
def jax_single(shared_runs):
    """`jax_single(preset)`: the folder of a preset's single-device jax run (5 steps, with its
    parity tensors), made once in the session: what the mesh, multi-process, parity-tensor and HLO
    tests read."""
    from tests.helpers import train

    def run(preset: str) -> Path:
        return (
            shared_runs(
                f"jax-{preset}",
                lambda out: train(
                    "jax_impl", out / "run", "--spec", preset, "--steps", "5", "--parity"
                ),
            )
            / "run"
        )

    return run


def pytest_sessionfinish(session, exitstatus):
    servers = getattr(session.config, "preload_servers", None)
    if servers is not None:
        counts = servers.stop()
        print(f"\n{served_line(counts)}")
        error = preloaded.unserved(counts)
        if error:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            print(error)
    log = getattr(session.config, "backend_guard_log", None)
    if log is None:
        return
    started = log.read_text().splitlines()
    log.unlink(missing_ok=True)
    if started:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(
            f"\nerror: {len(started)} backend process(es) started with the slow tests "
            "deselected:\n  " + "\n  ".join(started)
        )


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """One finished compare run (jax alone, mlp-tiny, 3 steps) that tests read or reuse with
    --jax-record; a test that changes it works on a copy."""
    from tests.helpers import run_cli

    out = tmp_path_factory.mktemp("finished") / "run"
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(out),
        "--backend",
        "jax",
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
    )
    assert proc.returncode == 0, proc.stderr
    return out

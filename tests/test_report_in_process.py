"""Report building and rendering in this process, no backend started: run records and tensor files
written the way a backend writes them (common.files.record), judged by
compare.reporting.report.build_report, rendered by compare.reporting.render.markdown."""

import json
import subprocess
import sys

import numpy as np
import pytest

from common.files.record import RunRecord, write_record
from common.files.tensor_file import write_tensors
from common.presets import load_spec
from common.vocab import BackendStatus, ExitCode, ReportStatus
from common.weights.checkpoint_ref import CheckpointRef
from compare.judge.tolerances import load_policy
from compare.reporting.render import markdown
from compare.reporting.report import ReportInputs, build_report, strict_report
from compare.runs.capture_runs import CAPTURE_DIR
from compare.runs.orchestrate import BackendRun
from tests.helpers import process_env

SPEC = load_spec("mlp-tiny", ["train.steps=3"])
RUN_ID = "in-process"
NAMES = ["jax", "torch"]
MODULES = ("layers.0", "layers.1", "head")  # in the order their forwards finish


def activations(broken: str | None) -> dict[str, np.ndarray]:
    """Each module's input and output; from `broken` on, outputs (and the inputs they feed) are
    off."""
    rng, out, off = np.random.default_rng(1), {}, False
    for module in MODULES:
        x = rng.standard_normal((2, 8)).astype(np.float32)
        out[f"{module}:in"] = x + (1.0 if off else 0.0)
        off = off or module == broken
        out[module] = np.tanh(x) + (1.0 if off else 0.0)
    return out


def write_run(
    directory,
    backend: str,
    *,
    broken: str | None = None,
    capture_apart: bool = False,
    capture_run_id: str = RUN_ID,
    only_activations: str | None = None,
) -> BackendRun:
    """A finished backend run: 3 losses, step-0 logits, loss and gradients, final params,
    activations (in the record's own tensors, or apart in <dir>/activations as compare's capture run
    leaves them)."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, 10)).astype(np.float32) + (0.5 if broken else 0.0)
    grads = {"layers.0.kernel": rng.standard_normal((8, 8)).astype(np.float32)}
    record = RunRecord(
        backend=backend,
        spec=SPEC.to_dict(),
        run_id=RUN_ID,
        numerics={"dtype": "float32", "matmul_precision": "highest"},
    )
    for step, loss in enumerate((2.30, 2.20, 2.10)):
        record.add_step(step, loss + (0.3 if broken else 0.0), 1.0)
    directory.mkdir(parents=True)
    groups = {
        "outputs": {"logits": logits, "loss": np.asarray(2.30, np.float32)},
        "grads": grads,
        "params": grads,
    }
    if not capture_apart:
        groups["activations"] = activations(broken or only_activations)
    record.tensors = write_tensors(directory, groups)
    write_record(directory, record)
    if capture_apart:
        capture = RunRecord(backend=backend, spec=SPEC.to_dict(), run_id=capture_run_id)
        capture.add_step(0, 2.30, 1.0)
        (directory / CAPTURE_DIR).mkdir()
        capture.tensors = write_tensors(
            directory / CAPTURE_DIR, {"activations": activations(broken)}
        )
        write_record(directory / CAPTURE_DIR, capture)
    return BackendRun(
        backend, directory, BackendStatus.OK, 0, "", 1.0, ["python", "-m", f"{backend}_impl"]
    )


def report_of(out, runs: dict) -> dict:
    return build_report(
        ReportInputs(SPEC, load_policy("default", "float32"), NAMES, "jax", out, RUN_ID),
        runs,
        False,
    )


def test_agreeing_runs_pass_and_render(tmp_path):
    runs = {n: write_run(tmp_path / n, n) for n in NAMES}
    report = report_of(tmp_path, runs)
    assert (
        report["not_built"] == []
        and report["status"] == ReportStatus.OK
        and report["exit_code"] == ExitCode.OK
    )
    parity = report["parity"]["torch"]
    assert parity["passed"] and parity["loss"]["max_abs"] == 0.0
    assert (
        parity["first_divergent_module"]["module"] is None
        and parity["first_divergent_module"]["not_compared"] == {}
    )
    assert report["backends"]["torch"]["losses"] == pytest.approx([2.30, 2.20, 2.10])
    md = markdown(report)
    assert (
        "**Verdict: pass** (status `ok`, exit code 0)" in md
        and "| first divergent step | - |" in md
    )
    assert (
        "| tensors within tolerance | 4/4 |" in md
        and "| outputs/logits | forward | 0.000e+00 |" in md
    )


@pytest.mark.parametrize("capture_apart", [False, True], ids=["in-record", "captured-apart"])
def test_a_port_that_parts_at_step_0_is_named_at_its_module(tmp_path, capture_apart):
    runs = {
        "jax": write_run(tmp_path / "jax", "jax", capture_apart=capture_apart),
        "torch": write_run(
            tmp_path / "torch", "torch", broken="layers.1", capture_apart=capture_apart
        ),
    }
    report = report_of(tmp_path, runs)
    assert report["status"] == ReportStatus.PARITY_FAILED and report["exit_code"] == ExitCode.PARITY
    parity = report["parity"]["torch"]
    assert parity["first_divergent_step"] == 0 and not parity["passed"]
    found = parity["first_divergent_module"]
    assert (
        found["module"] == "layers.1" and found["input_agrees"] and found["modules_diverging"] == 2
    )
    assert report["message"].startswith(
        "torch: parity failed: first divergent step 0, first divergent module "
        "layers.1; worst tensor"
    )
    md = markdown(report)
    assert "first divergent module layers.1" in md
    assert (
        "| first divergent module, backward pass (step 0) | not searched: the forwards part "
        "already |" in md
    )
    # the logits are off by 0.5 everywhere (max|ref| 2.3): each tolerance alone that would pass them
    assert (
        "| outputs/logits | forward | 5.000e-01 | 2.151e-01 | 206183.0% | 40 / 40 | NO | atol "
        "0.5, rtol 0.22 or "
        "100% of elements over (each alone) |" in md
    )
    # the module is found with its input agreeing: the one line offers no tolerance that would pass
    # (the table does)
    assert report["message"].endswith("worst tensor outputs/logits (max abs 0.5, within=False)")
    # fraction: tensors only
    assert "| forward | 1e-05 | 1e-04 | 0 |" in md and "| loss | 1e-04 | 5e-04 | - |" in md


def test_a_module_that_parts_with_its_input_agreeing_fails_though_every_tensor_is_within(tmp_path):
    """A difference too small to move the compared tensors (a Swin whose LayerNorms have eps 1e-6:
    its logits at 97 % of their bound, a correct port's at 0.1 %) passed beside a report naming the
    module that parts."""
    runs = {
        "jax": write_run(tmp_path / "jax", "jax"),
        "torch": write_run(tmp_path / "torch", "torch", only_activations="layers.1"),
    }
    report = report_of(tmp_path, runs)
    parity = report["parity"]["torch"]
    assert (
        all(t["within"] for t in parity["tensors"].values())
        and parity["first_divergent_step"] is None
    )
    assert parity["by_module"] and not parity["passed"]
    assert report["status"] == ReportStatus.PARITY_FAILED and report["exit_code"] == ExitCode.PARITY
    assert report["message"].startswith(
        "torch: parity failed: first divergent step none, first divergent module "
        "layers.1: its output leaves its bound though its input agrees, and every "
        "compared tensor is within tolerance"
    )
    assert "**Verdict: fail**" in markdown(report)


def test_a_capture_left_by_another_run_is_not_used(tmp_path):
    """A stale activations/ folder (another compare run's capture) locates nothing in this run."""
    runs = {
        "jax": write_run(tmp_path / "jax", "jax", capture_apart=True, capture_run_id="earlier"),
        "torch": write_run(tmp_path / "torch", "torch", broken="layers.1", capture_apart=True),
    }
    parity = report_of(tmp_path, runs)["parity"]["torch"]
    assert parity["first_divergent_step"] == 0 and parity["first_divergent_module"] is None


def test_a_difference_only_the_whole_model_shows_names_the_modules_left_out_as_suspects():
    """No compared submodule parts with agreeing inputs, so the whole model is named; a container
    left out of the comparison (only one side has it: its name did not match) may hold the
    difference, and the location says so."""
    from common.twin.modules import ROOT_MODULE
    from compare.judge.parity import first_divergent_module
    from compare.reporting.render import _module

    ours = activations(None)
    ours.update(
        {
            f"{ROOT_MODULE}:in": ours["layers.0:in"],
            ROOT_MODULE: ours["head"],
            "block.1": ours["layers.1"],
        }
    )
    theirs = {**ours, ROOT_MODULE: ours["head"] + 1.0}
    del theirs["block.1"]  # torch's container, unmatched on the NNX side
    found = first_divergent_module(ours, theirs, {"atol": 1e-5, "rtol": 1e-4}, ("jax", "torch"))
    assert (
        found["module"] == ROOT_MODULE
        and found["input_agrees"]
        and list(found["not_compared"]) == ["block.1"]
    )
    assert _module(found).startswith(
        "(model) (the model's own forward code or a module not compared (block.1): "
        "each compared submodule that differs was fed a differing input"
    )
    from compare.judge.messages import failure_message

    parity = {
        "worst": [],
        "first_divergent_step": 0,
        "first_divergent_module": found,
        "tensors": {},
    }
    assert failure_message("torch", parity) == (
        "torch: parity failed: first divergent step 0, first divergent "
        "module (model) or a module not compared (1)"
    )
    alone = _module({**found, "not_compared": {}})
    assert "outside its submodules: each submodule that differs was fed a differing input" in alone


def test_a_narrow_terminal_wraps_the_tables_names_and_never_cuts_them(tmp_path):
    """Captured output (a CI log: 80 columns or fewer) used to end names in an ellipsis
    ("params…")."""
    import io

    from rich.console import Console

    from compare.reporting.render import print_tables

    runs = {
        "jax": write_run(tmp_path / "jax", "jax"),
        "torch": write_run(tmp_path / "torch", "torch", broken="head"),
    }
    out = io.StringIO()
    print_tables(report_of(tmp_path, runs), Console(file=out, width=60))
    cells = [ln.split("│")[1].strip() for ln in out.getvalue().splitlines() if ln.startswith("│")]
    # its row
    first = next((i for i, c in enumerate(cells) if c and "outputs/logits".startswith(c)), None)
    assert first is not None and "…" not in out.getvalue()
    name = ""
    for cell in cells[first:]:  # the name folded over the row's lines, whole
        if not cell:
            break
        name += cell
    assert name == "outputs/logits"


def test_a_culprit_whose_input_agrees_only_barely_says_the_difference_may_enter_before_it():
    """A new user's Wav2Vec2 port with a tanh GELU between two Linears (a function, not a module)
    was named at the second Linear, whose input "agreed" at 98 % of its bound: the location now says
    the difference may enter before it."""
    from compare.judge.messages import failure_message
    from compare.judge.parity import first_divergent_module
    from compare.reporting.render import _module

    x = np.linspace(-1.0, 1.0, 16, dtype=np.float32).reshape(2, 8)
    ours = {"fc1:in": x, "fc1": x, "fc2:in": x, "fc2": x}
    # bound 1.1e-4: 91 % used
    theirs = {**ours, "fc2:in": x + np.float32(1e-4), "fc2": x + np.float32(1.0)}
    found = first_divergent_module(ours, theirs, {"atol": 1e-5, "rtol": 1e-4}, ("jax", "torch"))
    assert (
        found["module"] == "fc2"
        and found["input_agrees"]
        and found["input_used"] == pytest.approx(0.91, abs=0.01)
    )
    assert _module(found).startswith(
        "fc2 (its input agrees at 91% of its bound, its output does not: the "
        "difference may enter before it"
    )
    parity = {
        "worst": [],
        "first_divergent_step": None,
        "first_divergent_module": found,
        "tensors": {},
        "by_module": True,
    }
    assert failure_message("torch", parity).startswith(
        "torch: parity failed: first divergent step none, first divergent module fc2: its output "
        "leaves its bound "
        "though its input agrees (at 91% of its bound: the difference may enter before it)"
    )


@pytest.mark.error_case("report-disk-full")
def test_a_report_whose_last_file_cannot_be_written_leaves_none_of_its_files(tmp_path, monkeypatch):
    """report.md failing after the plots and report.json were written: the set is whole or absent,
    never half."""
    import errno

    from compare.reporting import output

    runs = {n: write_run(tmp_path / n, n) for n in NAMES}
    report = report_of(tmp_path, runs)

    def disk_full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(output, "write_text_atomic", disk_full)
    with pytest.raises(SystemExit) as exit_:
        output.write_report(report, tmp_path)
    assert exit_.value.code == ExitCode.IO
    # no plot, no report.json: only the runs
    assert sorted(p.name for p in tmp_path.iterdir()) == NAMES


def test_the_report_says_where_the_start_weights_came_from(tmp_path):
    from compare.runs.prepare import weights_origin

    assert weights_origin(SPEC, None) == (
        "the canonical init (common/weights/, train.seed=0), built alike by every backend"
    )
    hub, local = CheckpointRef.parse("hf:/models/qwen"), CheckpointRef.parse("/ckpt/w.safetensors")
    assert weights_origin(SPEC, hub) == (
        "the hf checkpoint /models/qwen, read once by compare and carried to every "
        "backend as init.safetensors"
    )
    assert weights_origin(SPEC, local) == "the canonical checkpoint /ckpt/w.safetensors"
    runs = {n: write_run(tmp_path / n, n) for n in NAMES}
    inputs = ReportInputs(
        SPEC,
        load_policy("default", "float32"),
        NAMES,
        "jax",
        tmp_path,
        RUN_ID,
        weights=weights_origin(SPEC, hub),
    )
    report = build_report(inputs, runs, False)
    assert (
        report["weights"]
        == "the hf checkpoint /models/qwen, read once by compare and carried to every "
        "backend as init.safetensors"
    )
    assert "Start weights: the hf checkpoint /models/qwen, read once by compare" in markdown(report)


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own priority is Linux's")
def test_the_plots_import_runs_at_compares_own_priority_and_the_plots_wait_for_it(tmp_path):
    """compare imports matplotlib while it waits on its backends, in a thread at compare's own
    priority: one of nice 19 held the GIL while the scheduler starved it, and compare's main thread
    waited on it for over a second beside busy processes (a backend started then, not yet told to
    its guard, outlived a SIGKILL of compare). The plots are drawn after it, from the same report as
    always."""
    runs = {n: write_run(tmp_path / n, n) for n in NAMES}
    (tmp_path / "report.json").write_text(json.dumps(strict_report(report_of(tmp_path, runs))))
    code = f"""
import json, os, sys
from pathlib import Path
from compare.reporting import plots
assert "matplotlib" not in sys.modules
plots.import_while_idle()
thread = plots._IMPORTING[0]
print(os.getpriority(os.PRIO_PROCESS, thread.native_id) == os.getpriority(os.PRIO_PROCESS, 0))
report = json.loads(Path({str(tmp_path / "report.json")!r}).read_text())
print(plots.write_plots(report, Path({str(tmp_path)!r})))
print(thread.is_alive(), plots._IMPORTING, "matplotlib.backends.backend_agg" in sys.modules)
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=process_env()
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "True",
        "['loss.png', 'loss_diff.png', 'step_time.png']",
        "False [] True",
    ]
    assert all(
        (tmp_path / name).stat().st_size > 1000
        for name in ("loss.png", "loss_diff.png", "step_time.png")
    )


def test_the_plots_log_axes_are_labelled_in_plain_text_and_within_a_decade_still_labelled(
    tmp_path,
):
    """matplotlib typesets a log axis' labels as mathtext, most of the plots' drawing time: ours are
    plain text (1e-05), minor ticks at 2x and 5x; an axis within a decade keeps labelled minor ticks
    (a step-time box plot of 3-8 ms)."""
    from compare.reporting import plots

    labels = {}
    for name, values in (("decades", [1e-7, 3e-6, 1e-3]), ("narrow", [3.1, 4.0, 7.9])):
        fig, ax = plots._figure()
        ax.semilogy(range(len(values)), values)
        plots._save(fig, tmp_path / f"{name}.png")
        low, high = ax.get_ylim()
        shown = [*ax.get_yticklabels(), *ax.get_yticklabels(minor=True)]
        labels[name] = [  # (matplotlib writes a minus sign, U+2212)
            t.get_text().replace("\u2212", "-")
            for t in shown
            if t.get_text() and low <= t.get_position()[1] <= high
        ]
    assert "1e-05" in labels["decades"] and not any("$" in t for v in labels.values() for t in v)
    assert len(labels["narrow"]) >= 2, labels


def test_a_run_judged_again_reads_only_what_was_written_since_and_is_reported_once(
    tmp_path, monkeypatch
):
    """compare judges a run again after each extra run (compare/reporting/evidence.py): the
    records and tensor files it judged are not read again, one written again is, and the report
    built from the last judging is the one a single judging of the same files builds."""
    import shutil

    from compare.reporting import evidence as evidence_module
    from compare.reporting.report import judge
    from compare.reporting.report import report_of as built_from

    read = []
    for reader in ("read_record", "read_tensors"):
        real = getattr(evidence_module, reader)
        monkeypatch.setattr(
            evidence_module,
            reader,
            lambda path, *more, real=real, reader=reader: (
                read.append((reader, path)) or real(path, *more)
            ),
        )
    runs = {n: write_run(tmp_path / n, n) for n in NAMES}
    inputs = ReportInputs(SPEC, load_policy("default", "float32"), NAMES, "jax", tmp_path, RUN_ID)
    evidence = evidence_module.Evidence()
    first = judge(inputs, runs, False, evidence=evidence)
    assert first.parity["torch"]["passed"] and len(read) == 4  # 2 records, 2 tensor files
    again = judge(inputs, runs, False, evidence=evidence)
    assert len(read) == 4 and built_from(again) == built_from(first)
    shutil.rmtree(tmp_path / "torch")  # an extra run's files, written over the first
    runs["torch"] = write_run(tmp_path / "torch", "torch", broken="layers.1")
    last = judge(inputs, runs, False, evidence=evidence)
    assert [path.parent.name for _, path in read[4:]] == ["torch", "torch"]
    assert not last.parity["torch"]["passed"] and last.status == ReportStatus.PARITY_FAILED
    report = built_from(last)
    assert report == report_of(tmp_path, runs) and report["exit_code"] == ExitCode.PARITY


def test_the_cpu_peak_is_looked_at_once_a_run_however_often_it_is_judged(tmp_path, monkeypatch):
    """MFU's divisor on the CPU: each judging looked at the peak again (0.15 s each, a run judged
    up to seven times); the run's Evidence looks once, a new run looks again."""
    from compare.reporting import evidence as evidence_module

    looks = []
    monkeypatch.setattr(
        evidence_module, "cpu_peak", lambda cache: looks.append(cache) or (2.5e11, "measured")
    )
    evidence = evidence_module.Evidence()
    assert evidence.cpu_peak(tmp_path) == evidence.cpu_peak(tmp_path) == (2.5e11, "measured")
    assert looks == [tmp_path]
    evidence_module.Evidence().cpu_peak(tmp_path)
    assert looks == [tmp_path, tmp_path]

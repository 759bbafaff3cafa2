"""Backends on different devices: numerics judged, timings and compiles marked as each backend's
own, and `--require-same-device` refusing (compare/judge/devices.py)."""

import json
import shutil

import pytest

from common.files.record import read_record, write_record
from common.vocab import ExitCode, ReportStatus
from compare.judge.tolerances import load_policy
from compare.reporting.render import markdown
from compare.reporting.report import ReportInputs, build_report
from tests.helpers import run_cli
from tests.test_report_in_process import NAMES, RUN_ID, SPEC, write_run

# what jax records on that card
H100 = {"device_platform": "gpu", "device_kind": "NVIDIA H100 80GB HBM3"}
CPU = {"device_platform": "cpu", "device_kind": "cpu"}


def report_on(tmp_path, platforms: dict, required: bool = False) -> dict:
    runs = {n: write_run(tmp_path / n, n) for n in NAMES}
    for name, platform in platforms.items():
        record = read_record(tmp_path / name)
        record.platform = platform
        write_record(tmp_path / name, record)
    inputs = ReportInputs(
        SPEC,
        load_policy("default", "float32"),
        NAMES,
        "jax",
        tmp_path,
        RUN_ID,
        same_device=required,
    )
    return build_report(inputs, runs, False)


@pytest.mark.parametrize(
    "jax, torch",
    [
        # torch_xla names the type only: the same CPU
        (CPU, {"device_platform": "CPU", "device_kind": "CPU"}),
        (
            {"device_platform": "tpu", "device_kind": "TPU v5 lite"},
            {"device_platform": "TPU", "device_kind": "TPU"},
        ),
    ],
)
def test_one_device_under_each_frameworks_name_is_one_device(tmp_path, jax, torch):
    report = report_on(tmp_path, {"jax": jax, "torch": torch}, required=True)
    assert (
        report["status"] == ReportStatus.OK
        and report["devices"]["same"]
        and report["devices"]["note"] is None
    )
    assert report["ratios"] == {"step_ms_median_torch_over_jax": 1.0}
    assert f"Device: {report['devices']['devices']['jax']} (every backend)" in markdown(report)
    assert "NOT COMPARABLE" not in markdown(report)


def test_different_devices_are_judged_but_their_timings_are_marked_and_refused_on_request(tmp_path):
    report = report_on(tmp_path / "a", {"jax": H100, "torch": CPU})
    note = (
        "the backends ran on different devices (jax on gpu (NVIDIA H100 80GB HBM3), torch on "
        "cpu): parity is "
        "judged, but step times, compiles and ratios are each backend's own, not comparable"
    )
    assert report["devices"] == {
        "devices": {"jax": "gpu (NVIDIA H100 80GB HBM3)", "torch": "cpu"},
        "same": False,
        "timings_comparable": False,
        "note": note,
    }
    # the numbers agree
    assert report["status"] == ReportStatus.OK and report["parity"]["torch"]["passed"]
    assert report["ratios"] == {}
    md = markdown(report)
    for title in (
        "Compiles",
        "Step time (warm-up steps excluded)",
        "Wall time and memory per backend process",
    ):
        assert (
            f"## {title} - NOT COMPARABLE: each backend's own, on its own device (jax: gpu "
            "(NVIDIA H100 80GB "
            "HBM3), torch: cpu)" in md
        )
    assert (
        "Devices: jax on gpu (NVIDIA H100 80GB HBM3), torch on cpu (different: timings not "
        "comparable)" in md
    )
    refused = report_on(tmp_path / "b", {"jax": H100, "torch": CPU}, required=True)
    assert (refused["status"], refused["exit_code"]) == (
        ReportStatus.NOT_COMPARABLE,
        ExitCode.PARITY,
    )
    assert refused["message"] == (
        "--require-same-device: the backends ran on different devices (jax on gpu (NVIDIA "
        "H100 80GB HBM3), torch on cpu); run them on one device, or drop "
        "--require-same-device to compare their numerics"
    )
    two_tpus = report_on(
        tmp_path / "c",
        {
            "jax": {"device_platform": "tpu", "device_kind": "TPU v5 lite"},
            "torch": {"device_platform": "tpu", "device_kind": "TPU v6e"},
        },
    )
    assert not two_tpus["devices"]["same"]  # one platform, two kinds of chip


@pytest.mark.error_case("devices-differ")
def test_compare_marks_a_record_from_another_device_with_one_line_and_refuses_it_on_request(
    finished_run, tmp_path
):
    """A jax run reused from a GPU machine (its record says so) against eager torch run here."""
    gpu_run = tmp_path / "jax-on-gpu"
    shutil.copytree(finished_run / "jax", gpu_run)
    record = read_record(gpu_run)
    record.platform = {**record.platform, **H100}
    write_record(gpu_run, record)
    common = [
        "--backend",
        "jax,torch",
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
        "--jax-record",
        str(gpu_run),
        "--quiet",
    ]
    proc = run_cli("compare", *common, "--out", str(tmp_path / "marked"))
    line = (
        "warning: the backends ran on different devices (jax on gpu (NVIDIA H100 80GB HBM3), "
        "torch on cpu): "
        "parity is judged, but step times, compiles and ratios are each backend's own, not "
        "comparable"
    )
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert proc.stderr.strip().splitlines() == [line]
    report = json.loads((tmp_path / "marked" / "report.json").read_text())
    assert report["verdict"] == "pass" and report["ratios"] == {} and not report["devices"]["same"]
    proc = run_cli(
        "compare",
        *common,
        "--torch-record",
        str(tmp_path / "marked" / "torch"),
        "--require-same-device",
        "--out",
        str(tmp_path / "refused"),
    )
    assert proc.returncode == ExitCode.PARITY and proc.stderr.strip().splitlines() == [line]
    report = json.loads((tmp_path / "refused" / "report.json").read_text())
    assert (
        report["status"] == ReportStatus.NOT_COMPARABLE
        and "--require-same-device" in report["message"]
    )

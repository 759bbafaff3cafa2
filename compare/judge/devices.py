"""Did every backend run on the same device? Numerics compare across devices; timings and compiles
do not.

`make demo` on a GPU machine would run eager torch on CUDA against a CPU-only JAX wheel; a record
reused with `--<name>-record` may come from another machine. The parity verdict is still made (the
numbers are what each device computed), but when the backends ran on different platforms or device
kinds every timing and compile figure is each backend's own, not a comparison: report.json's
`devices` says so, the ratios are left out, the tables that set backends side by side say so in
their title, and one warning line names the devices. `--require-same-device` (for CI) makes it a
refusal: status not_comparable, exit 1.
"""

from __future__ import annotations

from common.files.record import RunRecord
from common.vocab import ReportStatus
from compare.judge.verdict import CheckResult

# what each framework calls a platform, by the one name used here (torch: cuda; torch_xla: CUDA,
# TPU; jax: gpu)
PLATFORMS = {"cuda": "gpu", "gpu": "gpu", "rocm": "gpu", "tpu": "tpu", "cpu": "cpu"}
FLAG = "--require-same-device"


def device_of(record: RunRecord) -> tuple[str, str]:
    """(platform, device kind) of a run; the kind is '' where the framework names only the platform
    (torch_xla's device kind is its device type: 'CPU', 'CUDA', 'TPU')."""
    raw = str(record.platform.get("device_platform", "")).lower()
    platform = PLATFORMS.get(raw, raw)
    kind = str(record.platform.get("device_kind", ""))
    return platform, "" if kind.lower() in (raw, platform, *PLATFORMS) else kind


def device_words(device: tuple[str, str]) -> str:
    platform, kind = device
    return f"{platform} ({kind})" if kind else (platform or "unknown device")


def _same(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """The same platform, and the same kind where both name one."""
    return a[0] == b[0] and (not a[1] or not b[1] or a[1].lower() == b[1].lower())


def devices_check(records: dict[str, RunRecord], required: bool) -> CheckResult:
    """report.json's `devices`: each backend's device, whether all are one, and what that means for
    timings."""
    devices = {name: device_of(record) for name, record in records.items()}
    first = next(iter(devices.values()), None)
    same = all(_same(first, d) for d in devices.values())
    section = {
        "devices": {name: device_words(d) for name, d in devices.items()},
        "same": same,
        "timings_comparable": same,
        "note": None,
    }
    if same:
        return CheckResult("devices", ReportStatus.OK, section=section)
    named = ", ".join(f"{name} on {words}" for name, words in section["devices"].items())
    section["note"] = (
        f"the backends ran on different devices ({named}): parity is judged, but step times, "
        "compiles and ratios are each backend's own, not comparable"
    )
    if required:
        return CheckResult(
            "devices",
            ReportStatus.NOT_COMPARABLE,
            f"{FLAG}: the backends ran on different devices "
            f"({named}); run them on one device, or drop {FLAG} to compare their numerics",
            section,
        )
    return CheckResult("devices", ReportStatus.OK, section=section)


def one_device(results: list[CheckResult]) -> bool:
    """Whether the backends ran on one device, from the checks' results: else no timing is set
    beside another."""
    return all((r.section or {}).get("same", True) for r in results if r.check == "devices")

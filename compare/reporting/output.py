"""The end of a compare run: the report written (or exit 7), and what is printed (tables or JSON on
stdout, failures on stderr)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from rich.console import Console

from common.cli import fail
from common.files.fsutil import write_json_atomic, write_text_atomic
from common.vocab import BackendStatus, ExitCode, ReportStatus
from compare.options import Output
from compare.reporting.plots import PLOT_FILES, write_plots
from compare.reporting.render import markdown, print_tables
from compare.reporting.report import strict_report


def write_report(report: dict, out: Path) -> None:
    """report.json, report.md and the plots, or exit 7 with nothing half-written. The report is made
    strict JSON and checked first, so nothing is written for a report the JSON writer would
    refuse."""
    strict_report(report)
    try:
        report["plots"] = write_plots(report, out)
        write_json_atomic(out / "report.json", report)
        write_text_atomic(out / "report.md", markdown(report))
    except OSError as e:  # each write atomic, and the set whole: what was written of it is removed
        for name in (*PLOT_FILES, "report.json", "report.md"):
            with contextlib.suppress(OSError):
                (out / name).unlink(missing_ok=True)
        fail(
            f"cannot write the report to {out}: {e.strerror or e} (disk full, or the directory "
            "became "
            "unwritable); free space or pass another --out",
            ExitCode.IO,
        )


def _reader_gone() -> None:
    """stdout's reader stopped reading (`| head`): the rest goes nowhere, at exit too; the exit code
    stays."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class _Stdout(Console):
    # rich's own exits with 1, which would read as "parity failed"
    def on_broken_pipe(self) -> None:
        self.quiet = True
        _reader_gone()


def show(output: Output, report: dict, runs: dict) -> None:
    """The tables (or the JSON) on stdout, the failures on stderr."""
    try:
        if output.json:
            print((output.out / "report.json").read_text(), end="", flush=True)
        elif not output.quiet:
            # markup off: a backend's message ("[/pytorch/.../pair.cc:547] ...") is text, no tag
            print_tables(report, _Stdout(markup=False))
            sys.stdout.flush()
    except BrokenPipeError:
        _reader_gone()
    # stdout itself cannot be written (a full disk, /dev/full): the report is whole
    except OSError as e:
        _reader_gone()
        fail(
            f"cannot write to stdout: {e.strerror or e}; the report is in {output.out}", ExitCode.IO
        )
    apart = (report.get("devices") or {}).get("note")
    if apart:  # one line naming the devices, refused (--require-same-device) or not
        print(f"warning: {apart}", file=sys.stderr)
    failed = [run for run in runs.values() if run.status != BackendStatus.OK]
    for run in failed:
        print(
            f"error: {run.name}: {run.status}: {run.message} (logs: {run.run_dir})",
            file=sys.stderr,
        )
    if report["status"] == ReportStatus.BACKEND_FAILED and not failed:  # an extra run failed
        print(f"error: {report['message']}", file=sys.stderr)
    if report["status"] == ReportStatus.INTERNAL_ERROR:
        print(
            f"error: {report['message']} (report: {output.out / 'report.json'}; rerun with "
            "--debug for the "
            "traceback)",
            file=sys.stderr,
        )

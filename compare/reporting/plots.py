"""PNG plots for report.md: loss curves, |Δloss| against its tolerance, step-time distributions."""

from __future__ import annotations

import io
import math
import sys
import threading
from pathlib import Path

from common.files.fsutil import atomic_path

# every file write_plots may write
PLOT_FILES = ("loss.png", "loss_diff.png", "step_time.png", "generation.png")
_IMPORTING: list[threading.Thread] = []  # matplotlib's import in idle time, while there is one


def import_while_idle() -> None:
    """matplotlib's import and a first drawing (~0.3 s of the plots' ~0.5 s) started now, in a
    thread, while compare waits on its twin loader and on its backends' starts (their imports and
    compiles, seconds before any timed step); write_plots waits for it. At the process's own
    priority: a thread at a lower one holds the GIL while the scheduler starves it, and compare's
    main thread waited on it (over 1 s measured beside two busy loops, between starting a backend
    and telling its guard, so a SIGKILL then left the backend running)."""
    if "matplotlib.backends.backend_agg" in sys.modules:
        return

    def import_matplotlib():
        # and one small figure drawn, which loads the font and builds the log axis' label parser
        try:
            fig, ax = _figure()
            ax.semilogy([1.0, 10.0], label="Δ")
            ax.legend()
            fig.savefig(io.BytesIO(), dpi=20, format="png")
        except Exception:  # noqa: BLE001  (write_plots imports it again and says what failed)
            pass

    _IMPORTING.append(
        threading.Thread(target=import_matplotlib, name="matplotlib-import", daemon=True)
    )
    _IMPORTING[-1].start()


def write_plots(report: dict, run_dir: Path) -> list[str]:
    """Draw and write the plots of a strict report (compare/reporting/report.py strict_report);
    returns the files written. A plot that cannot be drawn (any exception but a failed write,
    OSError, which is the caller's exit 7) is left out and named in `report["not_built"]`."""
    written = []
    while _IMPORTING:
        _IMPORTING.pop().join()
    for name, draw in (
        ("loss.png", _loss_plot),
        ("loss_diff.png", _loss_diff_plot),
        ("step_time.png", _step_time_plot),
        ("generation.png", _generation_plot),
    ):
        try:
            if draw(report, run_dir / name):
                written.append(name)
        except OSError:
            raise
        except Exception as e:  # a plot's bad value must not cost the report
            why = f"{type(e).__name__}: {e}".splitlines()[0]
            report.setdefault("not_built", []).append({"part": f"plots.{name}", "why": why})
            print(
                f"warning: report: plot {name} could not be drawn ({why}); report.json says so "
                "(not_built)",
                file=sys.stderr,
            )
    return written


def _finite(values) -> list[float]:
    """Numbers to plot: None and report.json's "nan" / "inf" / "-inf" strings as NaN (a gap in the
    line)."""
    return [
        float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")
        for v in values
    ]


def _loss_plot(report: dict, path: Path) -> bool:
    with_losses = {n: b["losses"] for n, b in report["backends"].items() if b.get("losses")}
    if not with_losses:
        return False
    fig, ax = _figure()
    for name, losses in with_losses.items():
        ax.plot(
            range(len(losses)),
            _finite(losses),
            label=name,
            linestyle="-" if name == report["reference"] else "--",
        )
    ax.set(xlabel="step", ylabel="loss")
    _title(ax, "Training loss")
    ax.legend()
    _save(fig, path)
    return True


def _step_time_plot(report: dict, path: Path) -> bool:
    timed = {n: b["step_ms_all"] for n, b in report["backends"].items() if b.get("step_ms_all")}
    if not timed:
        return False
    fig, ax = _figure()
    ax.boxplot([_finite(v) for v in timed.values()], tick_labels=list(timed), showfliers=True)
    ax.set(ylabel="ms per step (synced)")
    _title(ax, "Step time after warm-up")
    ax.set_yscale("log")
    _save(fig, path)
    return True


def _loss_diff_plot(report: dict, path: Path) -> bool:
    """|loss_b - loss_ref| per step for every backend b, against the loss tolerance of the
    reference's loss (in bfloat16 under the noise floor, each pair's own per-step bounds, and the
    long-run band of its averaged gap)."""
    parity = report.get("parity") or {}
    diffs = {n: _finite((p.get("loss") or {}).get("per_step_abs") or []) for n, p in parity.items()}
    diffs = {n: d for n, d in diffs.items() if d}
    if not diffs:
        return False
    ref_name = report["reference"]
    ref = _finite(report["backends"][ref_name]["losses"])
    tol = report["tolerances"]["loss"]
    n = max(len(d) for d in diffs.values())
    bound = [tol["atol"] + tol["rtol"] * abs(v) for v in ref[:n]]
    fig, ax = _figure()
    positive = [v for d in diffs.values() for v in d + bound if v > 0 and math.isfinite(v)]
    floor = min(positive, default=1e-12) / 10
    for name, per_step in diffs.items():
        line = ax.semilogy(
            range(len(per_step)),
            [v if v else float("nan") for v in per_step],
            marker=".",
            label=f"|loss_{name} - loss_{ref_name}|",
        )[0]
        exact = [s for s, v in enumerate(per_step) if v == 0]
        if exact:  # a log axis has no 0: mark exact agreement along the bottom
            ax.plot(
                exact,
                [floor] * len(exact),
                linestyle="none",
                marker="o",
                fillstyle="none",
                color=line.get_color(),
                label=f"{name}: exactly equal",
            )
        floor_bounds = report["parity"][name]["loss"].get("bounds")
        # judged by the noise floor: this pair's own bound per step, not the fixed tolerance
        if floor_bounds:
            ax.semilogy(
                range(len(floor_bounds)),
                floor_bounds,
                color=line.get_color(),
                linestyle=":",
                label=f"{name}: step bound (noise floor)",
            )
        curves = report["parity"][name].get("curves")
        # the long-run check (compare/judge/curves.py): the averaged gap against its band
        if curves:
            steps = range(curves["window"] - 1, curves["window"] - 1 + len(curves["gap"]))
            ax.semilogy(
                steps,
                [abs(g) or float("nan") for g in curves["gap"]],
                color=line.get_color(),
                linestyle="--",
                label=f"{name}: |mean gap| over {curves['window']} steps",
            )
            ax.semilogy(
                steps,
                curves["band"],
                color=line.get_color(),
                linestyle="-.",
                alpha=0.6,
                label=f"{name}: its band ({curves['factor']:g}x the pair's own noise)",
            )
        first = report["parity"][name].get("first_divergent_step")
        if first is not None:
            ax.axvline(first, color=line.get_color(), alpha=0.4)
    if not any(p["loss"].get("bounds") for p in parity.values() if p.get("loss")):
        ax.semilogy(range(len(bound)), bound, color="red", linestyle=":", label="tolerance")
    ax.set(xlabel="step", ylabel="|Δloss|")
    _title(ax, f"Loss difference per step against {ref_name}")
    ax.legend(loc="upper left", fontsize="small")
    _save(fig, path)
    return True


def _generation_plot(report: dict, path: Path) -> bool:
    """--generate: each step's max |Δlogits| of every pair against the reference, and of every side
    against its own forward, with the pairs' bounds (compare/judge/generation.py)."""
    section = report.get("generation") or {}
    pairs, own = section.get("pairs") or {}, section.get("self") or {}
    if not pairs and not own:
        return False
    fig, ax = _figure()

    def positive(rows: list, key: str) -> list[float]:  # an exact 0 is no point on a log axis
        return [v if v > 0 else float("nan") for v in _finite(r[key] for r in rows)]

    for name, pair in pairs.items():
        steps = [s["step"] for s in pair["steps"]]
        ax.plot(steps, positive(pair["steps"], "max_abs"), marker="o", label=name)
        ax.plot(steps, positive(pair["steps"], "bound"), color="grey", linewidth=0.8)
    for name, check in own.items():
        steps = [s["step"] for s in check["steps"]]
        ax.plot(
            steps, positive(check["steps"], "max_abs"), linestyle=":", label=f"{name} vs itself"
        )
    ax.set(xlabel="decode step (0: the prefill's last token)", ylabel="max |Δlogits|")
    ax.set_yscale("log")
    _title(ax, f"Decode path per step against {section['reference']} (grey: bounds)")
    ax.legend(loc="best", fontsize="small")
    _save(fig, path)
    return True


def _figure():
    """A figure of its own (matplotlib's object API: no pyplot, whose import and global figure list
    a file writer does not need), its margins fixed: measuring every label to fit them
    (tight_layout) took a third of the drawing time, 0.14 s of compare's wall time for the three
    plots."""
    # here, not at the top: compare's start does not pay for it
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.5))
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.14, top=0.9)
    return fig, fig.subplots()


def _title(ax, title: str) -> None:
    """The title at the axes' top, said so (y=1): left to matplotlib, it measures every tick label
    on each draw to lift the title over a top axis these plots do not have."""
    ax.set_title(title, y=1.0)


def _plain_log_ticks(ax) -> None:
    """A log y axis labelled in plain text (1e-05, 2e-05, 1000), with minor ticks at 2x and 5x a
    decade where it spans more than one: matplotlib's default typesets every label as mathtext
    (10^-5, parsed by pyparsing) and places 8 minor ticks a decade, each a Tick of two lines and
    two texts: most of these plots' drawing time (measured). An axis within a decade keeps every
    minor tick, labelled as matplotlib labels them there."""
    from matplotlib.ticker import LogFormatter, LogLocator

    low, high = ax.get_ylim()
    if high > 10 * low:
        ax.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
    ax.yaxis.set_major_formatter(LogFormatter())
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))


def _save(fig, path: Path) -> None:
    for ax in fig.axes:
        if ax.get_yscale() == "log":  # set last: every semilogy call resets the axis' ticks
            _plain_log_ticks(ax)
    with atomic_path(path) as tmp:  # a disk that fills leaves no half image
        fig.savefig(tmp, dpi=110, format="png")

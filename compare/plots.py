"""PNG plots for report.md: loss curves, |Δloss| against its tolerance, step-time distributions."""
from __future__ import annotations

from pathlib import Path

from common.fsutil import atomic_path


def write_plots(report: dict, run_dir: Path) -> list[str]:
    import matplotlib  # here, not at the top: compare's start does not pay for it before the backends run

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    backends = report["backends"]
    written = []
    with_losses = {n: b["losses"] for n, b in backends.items() if b.get("losses")}
    if with_losses:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, losses in with_losses.items():
            ax.plot(range(len(losses)), [float("nan") if v is None else v for v in losses], label=name,
                    linestyle="-" if name == report["reference"] else "--")
        ax.set(xlabel="step", ylabel="loss", title="Training loss")
        ax.legend()
        written.append(_save(fig, run_dir / "loss.png"))
    parity = report.get("parity") or {}
    diffs = {n: (p.get("loss") or {}).get("per_step_abs") for n, p in parity.items()}
    diffs = {n: d for n, d in diffs.items() if d}
    if diffs:
        written.append(_loss_diff_plot(plt, report, diffs, run_dir / "loss_diff.png"))
    timed = {n: b["step_ms_all"] for n, b in backends.items() if b.get("step_ms_all")}
    if timed:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.boxplot(list(timed.values()), tick_labels=list(timed), showfliers=True)
        ax.set(ylabel="ms per step (synced)", title="Step time after warm-up")
        ax.set_yscale("log")
        written.append(_save(fig, run_dir / "step_time.png"))
    return written


def _loss_diff_plot(plt, report: dict, diffs: dict[str, list], path: Path) -> str:
    """|loss_b - loss_ref| per step for every backend b, against the loss tolerance of the reference's loss."""
    ref_name = report["reference"]
    ref = report["backends"][ref_name]["losses"]
    tol = report["tolerances"]["loss"]
    n = max(len(d) for d in diffs.values())
    bound = [tol["atol"] + tol["rtol"] * abs(v) if v is not None else float("nan") for v in ref[:n]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    floor = min([v for d in diffs.values() for v in d if v] + [min(bound)]) / 10
    for name, per_step in diffs.items():
        line = ax.semilogy(range(len(per_step)), [v if v else float("nan") for v in per_step], marker=".",
                           label=f"|loss_{name} - loss_{ref_name}|")[0]
        exact = [s for s, v in enumerate(per_step) if v == 0]
        if exact:  # a log axis has no 0: mark exact agreement along the bottom
            ax.plot(exact, [floor] * len(exact), linestyle="none", marker="o", fillstyle="none",
                    color=line.get_color(), label=f"{name}: exactly equal")
        first = report["parity"][name].get("first_divergent_step")
        if first is not None:
            ax.axvline(first, color=line.get_color(), alpha=0.4)
    ax.semilogy(range(len(bound)), bound, color="red", linestyle=":", label="tolerance")
    ax.set(xlabel="step", ylabel="|Δloss|", title=f"Loss difference per step against {ref_name}")
    ax.legend(loc="upper left", fontsize="small")
    return _save(fig, path)


def _save(fig, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:  # a disk that fills leaves no half image
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)
    return path.name

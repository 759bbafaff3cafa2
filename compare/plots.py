"""PNG plots for report.md: loss curves, |Δloss| against its tolerance, step-time distributions."""
from __future__ import annotations

from pathlib import Path


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
                    linestyle="-" if name == "jax" else "--")
        ax.set(xlabel="step", ylabel="loss", title="Training loss")
        ax.legend()
        written.append(_save(fig, run_dir / "loss.png"))
    parity = report.get("parity") or {}
    per_step = (parity.get("loss") or {}).get("per_step_abs")
    if per_step:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ref = backends["jax"]["losses"]
        tol = report["tolerances"]["loss"]
        bound = [tol["atol"] + tol["rtol"] * abs(v) if v is not None else float("nan") for v in ref[:len(per_step)]]
        steps = range(len(per_step))
        nonzero = [v if v else float("nan") for v in per_step]  # None (non-finite) and exact 0 are not drawn here
        ax.semilogy(steps, nonzero, marker=".", label="|loss_jax - loss_torch_xla|")
        finite = [v for v in nonzero if v == v]
        exact = [s for s in steps if per_step[s] == 0]
        if exact:  # a log axis has no 0: mark exact agreement along the bottom
            floor = min(finite + [min(bound)]) / 10
            ax.plot(exact, [floor] * len(exact), linestyle="none", marker="o", fillstyle="none", color="green",
                    label="exactly equal")
        ax.semilogy(range(len(bound)), bound, color="red", linestyle=":", label="tolerance")
        if parity.get("first_divergent_step") is not None:
            ax.axvline(parity["first_divergent_step"], color="red", alpha=0.4)
        ax.set(xlabel="step", ylabel="|Δloss|", title="Loss difference per step")
        ax.legend(loc="upper left", fontsize="small")
        written.append(_save(fig, run_dir / "loss_diff.png"))
    timed = {n: b["step_ms_all"] for n, b in backends.items() if b.get("step_ms_all")}
    if timed:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.boxplot(list(timed.values()), tick_labels=list(timed), showfliers=True)
        ax.set(ylabel="ms per step (synced)", title="Step time after warm-up")
        ax.set_yscale("log")
        written.append(_save(fig, run_dir / "step_time.png"))
    return written


def _save(fig, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name

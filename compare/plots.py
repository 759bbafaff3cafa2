"""PNG plots for report.md: loss curves, |Δloss| against its tolerance, step-time distributions."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def write_plots(report: dict, run_dir: Path) -> list[str]:
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
        floor = 1e-12  # exact agreement would vanish from a log axis
        ax.semilogy(range(len(per_step)), [max(v, floor) if v is not None else float("nan") for v in per_step],
                    marker=".", label="|loss_jax - loss_torch_xla|")
        ax.semilogy(range(len(bound)), bound, color="red", linestyle=":", label="tolerance")
        if parity.get("first_divergent_step") is not None:
            ax.axvline(parity["first_divergent_step"], color="red", alpha=0.4)
        ax.set(xlabel="step", ylabel="|Δloss|", title="Loss difference per step")
        ax.legend()
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name

"""The bfloat16 noise-floor policy's false-alarm rate and power, measured on long runs of real text.

    # 4 seeds x 3 correct pairs + 5 mis-ports, 300 steps
    python -m benchmarks.bf16_policy
    python -m benchmarks.bf16_policy --seeds 2 --steps 150 --backend jax,torch

Each run is a whole `python -m compare --dtype bfloat16` (the noise-floor policy, every backend also
run in float32) of gpt-tiny on the Python language reference (`common.data.text`, nothing
downloaded):
- correct ports: every backend against JAX, one compare per seed (`train.seed` and `data.seed` both
  set); a pair that fails is a false alarm, of the per-step rule, the long-run curves
  (compare/judge/curves.py) or a tensor;
- mis-ports: eager torch with one training setting off (`--torch-set`), each of which changes how
  the model trains but not its step-0 forward: what fraction of them the policy finds, and where.
Prints a markdown table and one JSON line (every pair's worst share of its bounds, where it parted).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common.data.text import pydoc_text, write_tokens

MIS_PORTS = {  # --torch-set value: what a port gets wrong (none of them changes the step-0 forward)
    "train.lr=3.15e-3": "learning rate 5 % high",
    "train.grad_clip=0": "no gradient clipping",
    "train.min_lr_ratio=0": "lr schedule decays to 0 (for 10 % of the peak)",
    "train.weight_decay_mask=matrices": "weight decay on matrices only (the reference decays "
    "every parameter)",
    "train.eps=1e-6": "AdamW epsilon 1e-6 (for 1e-8)",
}


def compare(out: Path, tokens: Path, steps: int, backends: str, *flags: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "compare",
        "--quiet",
        "--out",
        str(out),
        "--backend",
        backends,
        "--dtype",
        "bfloat16",
        "--steps",
        str(steps),
        "--set",
        "data.dataset=tokens-file",
        "--set",
        f"data.path={tokens}",
        *flags,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise RuntimeError(
            f"{' '.join(cmd[2:])}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
        )
    return json.loads((out / "report.json").read_text())


def pair_rows(report: dict, label: str) -> list[dict]:
    """One row per backend judged against the reference: did it pass, and by what margin."""
    rows = []
    for name, p in report["parity"].items():
        shares = [
            t["tolerance_used"]
            for t in p["tensors"].values()
            if t.get("tolerance_used") is not None and t.get("judged", True)
        ]
        loss = p["loss"]
        step_share = max(
            (
                d / b
                for d, b in zip(loss["per_step_abs"], loss.get("bounds") or [])
                if d is not None and b
            ),
            default=None,
        )
        curves = p.get("curves") or {}
        rows.append(
            {
                "run": label,
                "backend": name,
                "passed": p["passed"],
                "first_divergent_step": p["first_divergent_step"],
                "worst_tensor_share": max(shares, default=None),
                "worst_step_share": step_share,
                "curves_share": curves.get("worst_share"),
                "curves_parts_at": curves.get("parts_at"),
                "final_gap": curves.get("final_gap"),
                "final_band": curves.get("final_band"),
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bf16_policy", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument(
        "--backend", default="all", help="the correct ports' runs (--backend of compare)"
    )
    args = parser.parse_args()
    started, rows = time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="bf16-policy-") as tmp:
        tokens = Path(tmp) / "pydoc.bin"
        write_tokens(tokens, pydoc_text())
        for seed in range(args.seeds):
            report = compare(
                Path(tmp) / f"seed{seed}",
                tokens,
                args.steps,
                args.backend,
                "--set",
                f"train.seed={seed}",
                "--set",
                f"data.seed={seed}",
            )
            rows += pair_rows(report, f"correct, seed {seed}")
        for setting, what in MIS_PORTS.items():
            report = compare(
                Path(tmp) / setting, tokens, args.steps, "jax,torch", "--torch-set", setting
            )
            rows += pair_rows(report, f"mis-port: {what}")
    correct = [r for r in rows if r["run"].startswith("correct")]
    wrong = [r for r in rows if not r["run"].startswith("correct")]
    fmt = lambda v, spec=".0%": "-" if v is None else format(v, spec)  # noqa: E731
    print(
        "| run | backend | verdict | worst tensor | worst step | curves | parted at | end gap / "
        "band |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['run']} | {r['backend']} | {'pass' if r['passed'] else 'FAIL'} | "
            f"{fmt(r['worst_tensor_share'])} | {fmt(r['worst_step_share'])} | "
            f"{fmt(r['curves_share'])} | "
            f"{fmt(r['curves_parts_at'], 'd')} | {fmt(r['final_gap'], '+.4f')} / "
            f"{fmt(r['final_band'], '.4f')} |"
        )
    summary = {
        "steps": args.steps,
        "seeds": args.seeds,
        "correct_pairs": len(correct),
        "false_alarms": sum(not r["passed"] for r in correct),
        "mis_ports": len(wrong),
        "found": sum(not r["passed"] for r in wrong),
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps({**summary, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

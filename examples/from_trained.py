"""Every gallery example from a trained checkpoint as well as from init (issue 45, item 3).

    python examples/from_trained.py [--only resnet,llama] [--out DIR]

For each example, eager torch first trains the correct port's torch side on the task's own batches
(`python -m compare --backend torch`, at a raised learning rate); its final parameters and running
statistics become a canonical checkpoint (`params/...`, `state/...` of its tensors.npz). The correct
port and each mis-port are then compared on jax,torch from init and from that checkpoint (a mis-port
that passes in float32, its difference within float32's rounding, once more in float64), and the
table says, for each, both starts' exit codes and where each report places the difference: a correct
port passes from both, a mis-port fails from both at the same module. Weights near their init and
trained weights exercise a port differently (small gradients, larger activations, running statistics
far from 0 / 1): a verdict that holds from one only is a finding.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common.weights import save_checkpoint  # noqa: E402

# example: (its twin file, the correct port, the mis-ports, the learning rate and steps its torch
# side trains at)
GALLERY = {
    "resnet": (
        "examples/resnet/twin.py",
        "resnet_tiny",
        ["resnet_tiny_same_padding", "resnet_tiny_bn_momentum"],
        0.05,
        150,
    ),  # SGD: the loss falls below 0.7 of its start in ~150 steps
    "vit": ("examples/vit/twin.py", "vit_tiny", ["vit_tiny_tanh_gelu"], 3e-3, 40),
    "llama": ("examples/llama/twin.py", "llama_tiny", ["llama_tiny_misported"], 3e-3, 40),
    "qwen2": (
        "examples/hf_qwen2/twin.py",
        "qwen2_tiny",
        ["qwen2_rope_base_misported", "qwen2_norm_eps_misported"],
        3e-3,
        40,
    ),
    "bert": (
        "examples/bert_mlm/twin.py",
        "bert_tiny",
        ["bert_mask_ignored", "bert_tanh_gelu"],
        3e-3,
        40,
    ),
    "t5": (
        "examples/t5_seq2seq/twin.py",
        "t5_tiny",
        ["t5_scaled_attention", "t5_bidirectional_decoder_buckets"],
        3e-3,
        40,
    ),
    "unet": (
        "examples/unet_denoiser/twin.py",
        "unet_tiny",
        ["unet_same_padding_down", "unet_groupnorm_eps"],
        3e-3,
        40,
    ),
    "mixtral": (
        "examples/mixtral/twin.py",
        "mixtral_tiny",
        ["mixtral_not_renormalised", "mixtral_gelu_experts", "mixtral_softmax_over_tokens"],
        3e-3,
        40,
    ),
    "clip": (
        "examples/clip/twin.py",
        "clip_tiny",
        ["clip_one_directional_loss", "clip_text_not_normalised", "clip_pooled_first"],
        3e-3,
        40,
    ),
}


def compare(out: Path, *args: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "compare", "--quiet", "--out", str(out), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    report = out / "report.json"
    return proc.returncode, json.loads(report.read_text()) if report.exists() else {
        "message": proc.stderr[-300:]
    }


def trained_checkpoint(twin: str, lr: float, steps: int, out: Path) -> tuple[Path, list[float]]:
    """The correct port's torch side trained `steps` steps, as a canonical checkpoint; its
    losses."""
    code, report = compare(
        out / "train",
        "--twin",
        twin,
        "--backend",
        "torch",
        "--steps",
        str(steps),
        "--set",
        f"train.lr={lr}",
    )
    if code != 0:
        raise SystemExit(f"training {twin} failed (exit {code}): {report.get('message')}")
    tensors = np.load(out / "train" / "torch" / "tensors.npz")
    start = {
        key.removeprefix("params/"): tensors[key]
        for key in tensors.files
        if key.startswith("params/")
    }
    start.update({key: tensors[key] for key in tensors.files if key.startswith("state/")})
    save_checkpoint(
        out / "trained.safetensors",
        {k: np.asarray(v, np.float32) for k, v in start.items()},
        metadata={"source": f"{twin}'s torch side, {steps} steps at lr {lr}"},
    )
    return out / "trained.safetensors", report["backends"]["torch"]["losses"]


def where(report: dict) -> str:
    """Where a report places the difference, in a few words."""
    parity = (report.get("parity") or {}).get("torch") or {}
    forward, backward = (
        parity.get("first_divergent_module") or {},
        parity.get("first_divergent_module_backward") or {},
    )
    if forward.get("in_loss") or backward.get("in_loss"):
        return "in the loss"
    if forward.get("module"):
        return (
            f"{forward['module']} "
            f"({'input agrees' if forward.get('input_agrees') else 'input differs'})"
        )
    if backward.get("module"):
        return f"{backward['module']} (backward)"
    islands = [m for modules in (parity.get("float32_islands") or {}).values() for m in modules]
    return (
        f"- (float32 islands: {', '.join(islands[:2])}: judged at float32's bounds)"
        if islands
        else "-"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(GALLERY), help="examples, comma-separated")
    parser.add_argument("--out", type=Path, default=Path("from-trained"))
    args = parser.parse_args(argv)
    rows = []
    for name in args.only.split(","):
        file, correct, misports, lr, steps = GALLERY[name]
        folder = args.out / name
        checkpoint, losses = trained_checkpoint(f"{file}:{correct}", lr, steps, folder)
        print(f"{name}: trained, loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
        for twin in [correct, *misports]:
            row = [name, twin]
            for start, flags in (
                ("init", []),
                ("trained", ["--checkpoint", f"canonical:{checkpoint}"]),
            ):
                code, report = compare(
                    folder / f"{twin}-{start}",
                    "--twin",
                    f"{file}:{twin}",
                    "--backend",
                    "jax,torch",
                    *flags,
                )
                # within float32's bounds: float64 resolves what it cannot
                if code == 0 and twin != correct:
                    code, report = compare(
                        folder / f"{twin}-{start}-float64",
                        "--twin",
                        f"{file}:{twin}",
                        "--backend",
                        "jax,torch",
                        "--dtype",
                        "float64",
                        *flags,
                    )
                    code = f"0; float64: {code}"
                row += [str(code), where(report)]
            rows.append(row)
            print(" | ".join(rows[-1]), flush=True)
    table = [
        "| example | twin | exit from init | where | exit from trained | where |",
        "|---|---|---|---|---|---|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    (args.out / "table.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())

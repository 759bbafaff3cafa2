"""Bounds from a measured noise floor: bfloat16 runs (`--bf16-tolerance noise-floor`, their
default), long float32 runs.

Fixed atol/rtol in bfloat16 judge rounding by a coin flip: Hugging Face's Qwen2 on eager torch
failed one step-0 gradient at 109 % of the fixed bound, a correct port. The floor is measured
instead: compare runs every backend once more in float32 (same spec, start and batches, into
`noise-floor/<backend>`), and for every tensor and step a run's distance to its own float32 run is
what bfloat16 rounding alone moved it there. Two backends' bfloat16 runs can differ by about the sum
of their own noises; a tensor is within when

    max|other - ref| <= max(FACTOR * max(noise of ref, noise of other),
                            the float32 bound of its kind)

with noise = max|bf16 run - its own fp32 run|, and a step's loss likewise against the largest loss
noise up to that step. Each side's own noise, not the reference's alone: torchax accumulated the
RMSNorm scale gradients of Qwen2 in bfloat16, 9x JAX's noise there, a correct port that the
reference's floor alone failed. A mis-port moves a backend's float32 run as much as its bfloat16
one, so it does not widen its own floor. The step-0 logits stay judged as distributions (KL, top-1).
Every tensor row says which policy judged it, with its noise and bound; FACTOR's false-alarm rate
and power are in docs/findings.md.

Float32 has the same problem on long runs (`--fp32-tolerance noise-floor`, opt-in: it doubles the
run): a step where the loss is sharp turns the rounding differences of two correct ports into a loss
gap of 0.01 and then 0.29 (gpt-tiny, seed 3 of the Python reference text, from step 33), far over
the fixed 1e-4 + 5e-4 |loss|. There is no wider dtype to measure against, so each backend runs once
more from its start weights moved JITTER_ULPS units in the last place (train.start_jitter_ulps,
common.weights.jitter): how far that run drifts is how far this trajectory grows a difference of
rounding size. One ulp was too small a kick: on that run it moved the loss at the sharp step 4x less
than the two frameworks' own rounding differences did (those enter at every op of every step, the
jitter once); 16 moved it 2.8x more. Step 0's tensors stay at their float32 bounds (the jitter moves
them by about 1e-6 relative), so a port that parts at step 0 is judged exactly as before.

A float32 pair judged by the fixed bounds gets its floor measured all the same where only a floor
can tell rounding from a port error (`floor_needed`), at the cost of two more runs in that case
alone:
- where the fixed bounds contradict the module checks: step-0 gradients out while every module
  agrees, forward and backward. A weight's gradient is a sum over the batch, rounded with the size
  of its terms, not of the sum: from a trained checkpoint (small gradients, sums of large terms that
  cancel) a correct ResNet's convolution and BatchNorm gradients left the fixed bound by up to 3x on
  rounding alone, and 16 ulps of jitter moved them as far. The jitter at step 0 moves exactly such
  ill-conditioned tensors, and the floor judges them by it;
- where the runs part after a step 0 that agreed in everything: training grew a difference, of
  rounding (a sharp step, a routing choice flipped at a tie at a later step) or of the port (an
  optimizer setting), which the jittered run tells apart as the opt-in policy does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.files.tensor_summary import TensorSummary

FACTOR = 3.0
FLOOR_DIR = "noise-floor"
JITTER_ULPS = 16  # a float32 floor run's start: every weight 16 units in the last place up or down
# each dtype's floor run, beside the run itself: what it differs by (compare/runs/launch.py's
# floor_launch makes it)
FLOOR_TWIN = {
    "bfloat16": "its own float32 run",
    "float32": f"its own run from start weights {JITTER_ULPS} ulps off",
}


def floor_policy(dtype: str, bf16_tolerance: str, fp32_tolerance: str) -> str:
    """What judges a run of `dtype`: "noise-floor" or "fixed" (--bf16-tolerance,
    --fp32-tolerance)."""
    return {"bfloat16": bf16_tolerance, "float32": fp32_tolerance}.get(dtype, "fixed")


def max_abs(a, b) -> float | None:
    # a floor kept as a summary: none measured
    if isinstance(a, TensorSummary) or isinstance(b, TensorSummary):
        return None
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return None
    finite = np.isfinite(a) & np.isfinite(b)
    return float(np.max(np.abs(a[finite] - b[finite]))) if finite.any() else 0.0


def judge_tensors(
    tensors: dict, ref: dict, other: dict, floors: Floors, factor: float = FACTOR
) -> None:
    """Each tensor row of `tensors` (compare/judge/parity.py's compare_tensors) judged again against
    the noise floor of the two runs. Rows that are unmeasurable (a non-finite mismatch, shapes that
    differ), not judged (compare/judge/unreached.py), judged by a summary (--tensors summary) or the
    logits (judged as distributions) keep their verdict."""
    for key, entry in tensors.items():
        group, _, name = key.partition("/")
        if (
            key == "outputs/logits"
            or entry.get("abs") is None
            or entry.get("tolerance_used") is None
            or entry.get("judged") is False
        ):
            continue
        # --tensors summary: judged by its sample and statistics alone
        if entry.get("judged_by") == "summary":
            continue
        noises = [
            max_abs(run[group][name], floor[group][name])
            for run, floor in ((ref, floors.ref.tensors), (other, floors.other.tensors))
            if name in run.get(group, {}) and name in floor.get(group, {})
        ]
        if len(noises) != 2 or None in noises:
            continue
        bounds = floors.policy[entry["kind"]]
        values = np.asarray(ref[group][name], np.float64)
        scale = (
            float(np.max(np.abs(values[np.isfinite(values)]))) if np.isfinite(values).any() else 0.0
        )
        bound = max(factor * max(noises), bounds["atol"] + bounds["rtol"] * scale)
        diffs = np.abs(np.asarray(other[group][name], np.float64) - values)
        entry.pop("passes_with", None)
        entry.update(
            within=entry["abs"] <= bound,
            tolerance_used=entry["abs"] / bound if bound > 0 else None,
            over=int(np.count_nonzero(diffs[np.isfinite(diffs)] > bound)),
            judged_by="noise-floor",
            noise=max(noises),
            bound=bound,
            sensitivity=bound / scale if scale > 0 else None,
        )


def judge_losses(
    loss: dict, ref: list, other: list, floors: Floors, factor: float = FACTOR
) -> dict:
    """compare/judge/parity.py's loss comparison judged again: step s's bound is FACTOR times the
    largest loss noise of either run up to s (the noise grows as each run drifts from its float32
    twin), at least the float32 bound."""
    running, bounds, first = 0.0, [], None
    for step, diff in enumerate(loss["per_step_abs"]):
        for run, floor in ((ref, floors.ref.losses), (other, floors.other.losses)):
            if (
                step < min(len(run), len(floor))
                and run[step] is not None
                and floor[step] is not None
            ):
                running = max(running, abs(run[step] - floor[step]))
        a = ref[step] if step < len(ref) and ref[step] is not None else 0.0
        bound = max(
            factor * running, floors.policy["loss"]["atol"] + floors.policy["loss"]["rtol"] * abs(a)
        )
        bounds.append(bound)
        if first is None and (diff is None or diff > bound):
            first = step
    if (
        first is None
        and loss["first_divergent_step"] is not None
        and loss["first_divergent_step"] >= len(bounds)
    ):
        first = loss["first_divergent_step"]  # one side stopped early
    return {
        **loss,
        "first_divergent_step": first,
        "bounds": bounds,
        "judged_by": "noise-floor",
        "sensitivity": loss_sensitivity(ref, bounds),
    }


def floor_needed(judged) -> dict[str, str]:
    """{backend: why} of the float32 pairs, judged by the fixed bounds, whose failure only a
    measured floor tells from a port error: step-0 gradients or trained parameters out with every
    module compared agreeing forward and backward (none left out), the step-0 outputs and choices
    alike; or the runs parting after a step 0 that agreed in everything (`unmeasured_noise`,
    compare/judge/parity.py)."""
    if judged.dtype != "float32" or judged.tolerance_policy.get("policy") != "fixed":
        return {}
    found = {}
    for name, parity in judged.pairs().items():
        failing = [k for k, t in (parity.get("tensors") or {}).items() if not t["within"]]
        if parity.get("passed") or not parity.get("comparable"):
            continue
        # compare/judge/parity.py AFTER_TRAINING
        trained = ("params/", "state/", "buffers/", "eval/")
        if parity.get("unmeasured_noise") and all(k.startswith(trained) for k in failing):
            found[name] = (
                f"the runs parted at step {parity['first_divergent_step']} after a step 0 that "
                "agreed in "
                "everything (training grows rounding as it grows a port error)"
            )
        elif failing and _contradicts_modules(parity, failing):
            found[name] = (
                f"the fixed bounds failed {len(failing)} step-0 gradient or trained parameter "
                "tensor(s) "
                "while every module agreed, forward and backward (a sum over the batch rounds "
                "with the "
                "size of its terms: small gradients of large terms that cancel)"
            )
    return found


def _contradicts_modules(parity: dict, failing: list[str]) -> bool:
    forward = parity.get("first_divergent_module") or {}
    backward = parity.get("first_divergent_module_backward") or {}
    return (
        all(k.startswith(("grads/", "params/")) for k in failing)
        and bool(forward.get("modules_compared"))
        and not (forward.get("module") or forward.get("in_loss") or forward.get("not_compared"))
        and bool(backward.get("modules_compared"))
        and not (backward.get("module") or backward.get("in_loss"))
        and not (parity.get("decisions") or {}).get("flipped")
        and (parity.get("distribution") or {}).get("within") is not False
    )


def loss_sensitivity(ref: list, bounds: list) -> float | None:
    """The relative change of a step's loss that its bound would have failed, at the least sensitive
    step (compare/judge/sensitivity.py)."""
    shares = [b / abs(a) for a, b in zip(ref, bounds) if a is not None and a != 0]
    return max(shares) if shares else None


@dataclass(frozen=True)
class FloorRun:
    """A backend's float32 run beside its bfloat16 one: its losses and parity tensors."""

    losses: list
    tensors: dict


@dataclass(frozen=True)
class Floors:
    """The two float32 runs of a pair and the float32 policy (every bound is at least its float32
    one)."""

    ref: FloorRun
    other: FloorRun
    policy: dict

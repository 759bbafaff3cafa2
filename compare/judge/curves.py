"""Long-run agreement of two bfloat16 loss curves: does the port train as well as the reference?

Step by step, a bfloat16 run wanders from its float32 twin, and the largest wander so far (the
per-step rule of compare/judge/noise_floor.py) soon bounds every later step loosely: on gpt-tiny
over 300 steps of the Python reference text the raw noise peaks at 0.2 where the learning rate does,
so every later step's bound is 0.6, while a port whose lr schedule ends elsewhere trains worse by
0.03 for good and stays under it. Over a long run the question is the trend, not one step: both loss
curves are averaged over a trailing WINDOW of steps (the same batches on both sides, so what the
batches add to the loss cancels in the gap), and at every step s from WINDOW - 1 on

    |mean(other - ref)|(s) <= FACTOR * max over the SPAN steps up to s of
                                max(|mean(ref - its float32 run)|, |mean(other - its float32 run)|)

(at least the float32 loss bound): each run's own bfloat16 wander, averaged the same way, as large
as it was lately (the lr peak's noise is forgotten SPAN steps later). Both runs' wander, not the
reference's alone: bfloat16 trajectories are chaotic, and one run of a correct port can settle 0.1
below the others for good (torch_xla on seed 3, its float32 run agreeing with JAX's); the
reference's wander alone failed 2 of 12 correct pairs, the pair's none (worst 51 % of the band). A
mis-port moves a run's float32 twin with it, so it does not widen its own band; a port that is wrong
only in bfloat16 (master weights kept in bfloat16) does, which this check shares with the per-step
rule. The step where the gap first leaves the band is where the curves part; the gap at the last
step says by how much the port trains worse (positive) or better. Measured false alarms and power:
docs/findings.md (python -m benchmarks.bf16_policy). A float32 run judged by its jittered floor
(--fp32-tolerance noise-floor) gets the same check, its floor runs in place of the float32 ones (not
measured over long runs yet).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from compare.judge.noise_floor import FACTOR

# steps averaged: the smoothed noise of gpt-tiny's 300 bf16 steps is 1/16 of the raw one
WINDOW = 25
# the band remembers the noise of the last SPAN steps (and shorter runs are judged step by step)
SPAN = 4 * WINDOW


def _trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """The mean of every `window` consecutive values, ending at steps window-1 .. n-1."""
    return np.convolve(values, np.ones(window) / window, mode="valid")


def compare_curves(
    ref: list,
    other: list,
    ref_floor: list,
    other_floor: list,
    loss_bounds: dict,
    window: int = WINDOW,
    span: int = SPAN,
    factor: float = FACTOR,
) -> dict | None:
    """The long-run agreement of two loss curves (`ref`, `other`) against their own noise-floor runs
    (`ref_floor`, `other_floor`: a bfloat16 run's float32 twin, a float32 run's jittered one), or
    None where it does not apply: fewer than `span` steps, or a step without a
    finite loss (the per-step rule names that one). Steps are counted from 0; `gap` and `band` start
    at step `window - 1`."""
    n = min(map(len, (ref, other, ref_floor, other_floor)))
    losses = [run[:n] for run in (ref, other, ref_floor, other_floor)]
    if n < max(span, window) or any(v is None for run in losses for v in run):
        return None
    a, b, a32, b32 = (np.asarray(run, np.float64) for run in losses)
    gap = _trailing_mean(b - a, window)
    noise = np.maximum(
        np.abs(_trailing_mean(a - a32, window)), np.abs(_trailing_mean(b - b32, window))
    )
    recent = sliding_window_view(np.concatenate([np.zeros(span - 1), noise]), span).max(axis=1)
    fp32_bound = loss_bounds["atol"] + loss_bounds["rtol"] * np.abs(_trailing_mean(a, window))
    band = np.maximum(factor * recent, fp32_bound)
    over = np.flatnonzero(np.abs(gap) > band)
    return {
        "window": window,
        "span": span,
        "factor": factor,
        "steps": n,
        "parts_at": int(over[0]) + window - 1 if over.size else None,
        "within": not over.size,
        "steps_over": int(over.size),
        "worst_share": float(np.max(np.abs(gap) / band)),
        "final_gap": float(gap[-1]),
        "final_band": float(band[-1]),
        "final_noise": float(noise[-1]),
        "gap": gap.tolist(),
        "band": band.tolist(),
    }


def curves_words(curves: dict) -> str:
    """One phrase for a failure message: where the smoothed curves part and how far apart they
    end."""
    how = "worse" if curves["final_gap"] > 0 else "better"
    return (
        f"loss curves part at step {curves['parts_at']} (mean over {curves['window']} steps; it "
        "ends "
        f"training {how} by {abs(curves['final_gap']):.3g}, against a band of "
        f"{curves['final_band']:.3g}: "
        f"{curves['factor']:g}x the larger of the two runs' own drifts from their noise-floor runs)"
    )

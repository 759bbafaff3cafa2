"""Side-by-side timing helpers (numpy only): interleaved rounds, medians, ratios."""
from __future__ import annotations

import argparse
import statistics
import time


def parse_args(description: str) -> argparse.Namespace:
    """The flags every overhead benchmark takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--spec", default="mlp-tiny")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps-per-round", type=int, default=20)
    return parser.parse_args()


def interleaved(candidates: dict, rounds: int, steps_per_round: int) -> dict[str, list[float]]:
    """Run each candidate's `step()` (synced) in alternating rounds; per-step ms for each.

    Alternating A, B, A, B ... spreads machine noise (other jobs, frequency
    changes) evenly over the candidates, so their ratio is trustworthy even
    when absolute times drift.
    """
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, step in candidates.items():
            for _ in range(steps_per_round):
                start = time.perf_counter()
                step()
                samples[name].append((time.perf_counter() - start) * 1e3)
    return samples


def summarize(samples: dict[str, list[float]], baseline: str) -> dict:
    out = {name: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v), "n": len(v)}
           for name, v in samples.items()}
    for name in out:
        out[name]["ratio_to_" + baseline] = out[name]["median_ms"] / out[baseline]["median_ms"]
    return out

"""Side-by-side timing helpers (numpy only): interleaved rounds, medians of rounds, ratios."""

from __future__ import annotations

import argparse
import statistics
import time


def parse_args(description: str, extra=None) -> argparse.Namespace:
    """The flags every overhead benchmark takes (`extra(parser)` adds its own)."""
    parser = argparse.ArgumentParser(description=description)
    if extra:
        extra(parser)
    parser.add_argument(
        "--spec", default="mlp-tiny", help="preset or spec file (a prepared twin's spec.json)"
    )
    parser.add_argument(
        "--checkpoint", default=None, help="start weights (a prepared twin's init.safetensors)"
    )
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps-per-round", type=int, default=10)
    return parser.parse_args()


def interleaved(
    candidates: dict, rounds: int, steps_per_round: int, before_round: dict | None = None
) -> dict[str, list[list[float]]]:
    """Run each candidate's `step()` (synced) in alternating rounds; per round, per-step ms.

    Alternating rounds, in A, B, C then C, B, A order, spread machine noise
    (other jobs, frequency changes) and the cost of coming right after another
    candidate (measured: up to 5 % on eager torch on this CPU) evenly over the
    candidates, so their ratio is trustworthy even when absolute times drift.
    `before_round[name]()` runs untimed before each of that candidate's rounds
    (e.g. installing or removing instrumentation).
    """
    samples: dict[str, list[list[float]]] = {name: [] for name in candidates}
    for i in range(rounds):
        order = list(candidates.items())
        for name, step in order if i % 2 == 0 else order[::-1]:
            if before_round and name in before_round:
                before_round[name]()
            times = []
            for _ in range(steps_per_round):
                start = time.perf_counter()
                step()
                times.append((time.perf_counter() - start) * 1e3)
            samples[name].append(times)
    return samples


def spread(values: list[float]) -> dict:
    """Median with min and max: how every repeated figure is reported."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def summarize(samples: dict[str, list[list[float]]]) -> dict:
    """Per candidate: the median step ms of each round, summarized over rounds."""
    return {
        name: spread([statistics.median(r) for r in rounds]) for name, rounds in samples.items()
    }


def ratio(samples: dict[str, list[list[float]]], name: str, baseline: str) -> dict:
    """Per-round ratio of median step times (rounds ran back to back), summarized over rounds."""
    return spread(
        [
            statistics.median(a) / statistics.median(b)
            for a, b in zip(samples[name], samples[baseline])
        ]
    )

"""The statistical parity test's false-alarm rate, measured on identical implementations.

    # 40 pairs, 5 seeds each, gpt-tiny with dropout 0.1
    python -m benchmarks.false_alarm
    python -m benchmarks.false_alarm --pairs 20 --seeds 3 --steps 10

A pair is the same implementation (eager torch, in this process) run twice over the same K seeds
(the same start weights and batches per seed) with different dropout masks (train.dropout_seed
differs): exactly the null hypothesis compare's statistical mode tests. Each pair goes through the
same test (compare/judge/statistical.py: per-seed mean loss, paired t-test, alpha 0.01); the share
of pairs it fails is the false-alarm rate. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def mean_loss(spec_name: str, overrides: list[str], out: Path) -> float:
    from common.presets import load_spec
    from driver import harness
    from driver.harness import RunOptions
    from torch_impl.train import make_trainer

    options = RunOptions(throughput_steps=0, out_dir=out)
    record, _ = harness.run(lambda: make_trainer(load_spec(spec_name, overrides), options), options)
    return float(np.mean(record.losses))


def main() -> int:
    from compare.judge.statistical import ALPHA, paired_t_test

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.false_alarm", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--spec", default="gpt-tiny")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    started, p_values = time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="false-alarm-") as tmp:
        for pair in range(args.pairs):
            diffs = []
            for k in range(args.seeds):
                seed = 1000 * pair + k
                base = [
                    f"model.dropout={args.dropout}",
                    f"train.steps={args.steps}",
                    f"train.seed={seed}",
                    f"data.seed={seed}",
                ]
                a = mean_loss(args.spec, base + [f"train.dropout_seed={seed}"], Path(tmp) / "a")
                b = mean_loss(
                    args.spec, base + [f"train.dropout_seed={seed + 500_000}"], Path(tmp) / "b"
                )
                diffs.append(b - a)
            p_values.append(paired_t_test(diffs)[1])
    alarms = sum(p < ALPHA for p in p_values)
    print(
        json.dumps(
            {
                "spec": args.spec,
                "dropout": args.dropout,
                "pairs": args.pairs,
                "seeds": args.seeds,
                "steps": args.steps,
                "alpha": ALPHA,
                "false_alarms": alarms,
                "false_alarm_rate": alarms / args.pairs,
                "p_values": p_values,
                "seconds": time.perf_counter() - started,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

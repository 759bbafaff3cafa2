"""The toolkit's torch_xla train step vs a minimal hand-written torch_xla loop, side by side.

Both run the same torch model, weights, optimizer and batch (already on the
device) in this process; the minimal loop is the plain PyTorch/XLA recipe:
forward, backward, clip, `xm.optimizer_step`, `torch_xla.sync()`,
`xm.wait_device_ops()`. Also reports the share of the step spent tracing
(Python building the lazy graph), measured on the toolkit's step.
Prints one JSON line. Run: python -m benchmarks.overhead_torch_xla --spec mlp-tiny
"""
from __future__ import annotations

import json
import os
import statistics
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402

from benchmarks.timing import interleaved, parse_args, summarize  # noqa: E402
from common.spec import load_spec  # noqa: E402
from common.weights import init_params  # noqa: E402
from torch_xla_impl import convert  # noqa: E402
from torch_xla_impl.instrument import CompileMonitor  # noqa: E402
from torch_xla_impl.models import build_model  # noqa: E402
from torch_xla_impl.train import TorchXlaTrainer, cross_entropy, make_optimizer  # noqa: E402


def minimal_loop(spec, batch):
    device = torch_xla.device()
    model = build_model(spec.model)
    convert.load_canonical(model, init_params(spec.model, spec.train.seed), spec.model)
    model = model.to(device)
    optimizer = make_optimizer(model.parameters(), spec.train)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = cross_entropy(model(batch["inputs"]), batch["targets"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.train.grad_clip)
        xm.optimizer_step(optimizer)
        torch_xla.sync()
        xm.wait_device_ops()

    return step


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    spec = load_spec(args.spec)
    monitor = CompileMonitor()
    trainer = TorchXlaTrainer(spec)
    batch = trainer.global_device_batch(0)
    trace_ms = []

    def toolkit():
        start = time.perf_counter()
        loss = trainer.step(0, batch)  # noqa: F841  (kept alive until the sync, as in the loop)
        trace_ms.append((time.perf_counter() - start) * 1e3)
        trainer.sync(0)
        trainer.wait()
        monitor.collect()

    candidates = {"minimal": minimal_loop(spec, batch), "toolkit": toolkit}
    for step in candidates.values():
        for _ in range(3):
            step()
    trace_ms.clear()
    result = summarize(interleaved(candidates, args.rounds, args.steps_per_round), baseline="minimal")
    result["toolkit"]["trace_median_ms"] = statistics.median(trace_ms)
    result["toolkit"]["trace_share"] = result["toolkit"]["trace_median_ms"] / result["toolkit"]["median_ms"]
    print(json.dumps({"backend": "torch_xla", "spec": args.spec, **result}))


if __name__ == "__main__":
    main()

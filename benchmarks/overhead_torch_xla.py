"""The toolkit's torch_xla train step vs a minimal hand-written loop, vs itself without
instrumentation, and in each trace mode.

All candidates run the same torch model, weights, optimizer and batch (already
on the device) in this process, interleaved round by round:
- `minimal`: the plain PyTorch/XLA recipe: forward, backward, clip,
  `xm.optimizer_step`, `torch_xla.sync()`, `xm.wait_device_ops()`, then
  `loss.item()` (every candidate produces a per-step loss on the host);
- `toolkit`: the loop body `compare` runs (`TorchXlaTrainer.timed_step`,
  lazy mode): timing, the metrics read, the loss copied to the host;
- `uninstrumented`: the same trainer's step, sync, wait and loss copied to the
  host (training output the record needs), without timing or metrics reads;
- with `--trace-modes` instead (another process): `timed_step` on trainers
  in `lazy`, `compile` and `dynamo` mode.
Also the tracing share (Python building the graph) of each.
Prints one JSON line. Run: python -m benchmarks.overhead_torch_xla --spec mlp-tiny [--trace-modes]
"""

from __future__ import annotations

import json
import os
import statistics

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402

from benchmarks.timing import interleaved, parse_args, ratio, spread, summarize  # noqa: E402
from common.presets import load_spec  # noqa: E402
from common.twin import twin_of  # noqa: E402
from common.twin.outputs import logits_of  # noqa: E402
from common.weights import start_params  # noqa: E402
from driver.harness import RunOptions  # noqa: E402
from torch_impl import convert  # noqa: E402
from torch_impl.models import build_model  # noqa: E402
from torch_impl.optim import make_optimizer  # noqa: E402
from torch_impl.train import cross_entropy  # noqa: E402
from torch_xla_impl.flags import XlaFlags  # noqa: E402
from torch_xla_impl.instrument import CompileMonitor  # noqa: E402
from torch_xla_impl.train import TorchXlaTrainer  # noqa: E402


def minimal_loop(spec, batch, checkpoint=None):
    device = torch_xla.device()
    model = build_model(spec.model)
    convert.load_canonical(model, start_params(spec.model, spec.train.seed, checkpoint), spec.model)
    model = model.to(device)
    optimizer = make_optimizer(model.parameters(), spec.train)
    which = twin_of(spec.model).logits  # a Hugging Face model returns a ModelOutput

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = cross_entropy(logits_of(model(batch["inputs"]), which), batch["targets"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.train.grad_clip)
        xm.optimizer_step(optimizer)
        torch_xla.sync()
        xm.wait_device_ops()
        loss.item()

    return step


def main() -> None:
    args = parse_args(
        __doc__.splitlines()[0],
        extra=lambda p: p.add_argument(
            "--trace-modes", action="store_true", help="compare lazy, compile and dynamo instead"
        ),
    )
    spec = load_spec(args.spec)
    monitor = CompileMonitor()
    modes = ("lazy", "compile", "dynamo") if args.trace_modes else ("lazy",)
    trainers = {
        mode: TorchXlaTrainer(
            spec, RunOptions(checkpoint=args.checkpoint, own=XlaFlags(trace_mode=mode)), monitor
        )
        for mode in modes
    }
    batch = trainers["lazy"].global_device_batch(0)
    trace_ms: dict[str, list[float]] = {}

    def instrumented(name: str, trainer: TorchXlaTrainer):
        trace_ms[name] = []

        def step():
            trainer.timed_step(0, batch)
            trace_ms[name].append(trainer.trace_ms[-1])

        return step

    def uninstrumented():
        loss = trainers["lazy"].step(0, batch)  # kept alive until the sync, as in the loop
        trainers["lazy"].sync(0)
        trainers["lazy"].wait()
        loss.item()

    # Separate processes: a dynamo trainer in the process changed the minimal loop's time
    # (measured on gpt-tiny: 23.9 ms with one present, 26.4 ms without), not the toolkit's.
    if args.trace_modes:
        candidates = {mode: instrumented(mode, trainer) for mode, trainer in trainers.items()}
    else:
        candidates = {
            "minimal": minimal_loop(spec, batch, args.checkpoint),
            "toolkit": instrumented("toolkit", trainers["lazy"]),
            "uninstrumented": uninstrumented,
        }
    for step in candidates.values():  # compile and warm up outside the measurement
        for _ in range(3):
            step()
    warm_compiles = len(monitor.events)
    for values in trace_ms.values():
        values.clear()
    samples = interleaved(candidates, args.rounds, args.steps_per_round)
    monitor.collect()
    step_ms = summarize(samples)
    tracing = {name: spread(values) for name, values in trace_ms.items()}
    for name in trace_ms:
        tracing[name]["share_of_step"] = statistics.median(trace_ms[name]) / step_ms[name]["median"]
    if args.trace_modes:
        ratios = {
            "compile_over_lazy": ratio(samples, "compile", "lazy"),
            "dynamo_over_lazy": ratio(samples, "dynamo", "lazy"),
        }
    else:
        ratios = {
            "toolkit_over_minimal": ratio(samples, "toolkit", "minimal"),
            "instrumented_over_uninstrumented": ratio(samples, "toolkit", "uninstrumented"),
        }
    print(
        json.dumps(
            {
                "backend": "torch_xla",
                "spec": args.spec,
                "trace_modes": args.trace_modes,
                "step_ms": step_ms,
                "tracing_ms": tracing,
                "ratios": ratios,
                "compiles_while_timed": len(monitor.events) - warm_compiles,
            }
        )
    )


if __name__ == "__main__":
    main()

"""The toolkit's eager PyTorch train step vs a minimal hand-written loop (interleaved side by side).

- `minimal`: what a PyTorch user writes: zero_grad, forward, cross-entropy, backward,
  clip_grad_norm_, optimizer.step(), the loss read with `.item()`;
- `toolkit`: the loop body `compare` runs (`TorchTrainer.timed_step`: the lr of the step set on the
  param groups, the same pieces, the timing).
Eager PyTorch has no instrumentation to take out (it compiles nothing): `uninstrumented` is the
trainer's step with the loss read and no timing.
Prints one JSON line. Run: python -m benchmarks.overhead_torch --spec mlp-tiny
"""

from __future__ import annotations

import json

import torch

from benchmarks.timing import interleaved, parse_args, ratio, summarize
from common.presets import load_spec
from common.twin import twin_of
from common.twin.outputs import logits_of
from common.weights import start_params
from driver.harness import RunOptions
from torch_impl.convert import load_canonical
from torch_impl.models import build_model
from torch_impl.optim import make_optimizer
from torch_impl.train import TorchTrainer, cross_entropy


def minimal_loop(spec, inputs, targets, checkpoint=None):
    model = load_canonical(
        build_model(spec.model), start_params(spec.model, spec.train.seed, checkpoint), spec.model
    )
    model = model.to(inputs.device)  # CUDA when present, as the trainer
    optimizer = make_optimizer(model.parameters(), spec.train)
    which = twin_of(spec.model).logits  # a Hugging Face model returns a ModelOutput

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = cross_entropy(logits_of(model(inputs), which), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.train.grad_clip)
        optimizer.step()
        loss.item()

    return step


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    spec = load_spec(args.spec)
    trainer = TorchTrainer(spec, RunOptions(checkpoint=args.checkpoint))
    inputs, targets = trainer.batch(0)
    counter = iter(range(10**9))
    candidates = {
        "minimal": minimal_loop(spec, inputs, targets, args.checkpoint),
        "toolkit": lambda: trainer.timed_step(next(counter) % spec.train.steps, (inputs, targets)),
        "uninstrumented": lambda: trainer.step(0, inputs, targets).item(),
    }
    for step in candidates.values():  # warm up (allocator, thread pool) outside the measurement
        for _ in range(3):
            step()
    samples = interleaved(candidates, args.rounds, args.steps_per_round)
    print(
        json.dumps(
            {
                "backend": "torch",
                "spec": args.spec,
                "step_ms": summarize(samples),
                "ratios": {
                    "toolkit_over_minimal": ratio(samples, "toolkit", "minimal"),
                    "instrumented_over_uninstrumented": ratio(samples, "toolkit", "uninstrumented"),
                },
                "compiles_while_timed": 0,
            }
        )
    )


if __name__ == "__main__":
    main()

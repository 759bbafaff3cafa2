"""torch.optim from the spec: the twin of `jax_impl/optim.py` (same function names). Every
hyperparameter is explicit, the lr of each step set on the param groups (`TrainSpec.lr_at`, as
nanoGPT does), the global-norm clip by torch's own formula."""

from __future__ import annotations

# torch.optim's constructors import torch._dynamo on first use (~0.6 s): imported here, so a run
# pays it with its imports, as every torch training script does, and it is not counted as the
# toolkit's own setup
import torch
import torch._dynamo  # noqa: F401

from common.spec import TrainSpec


def make_optimizer(params, train: TrainSpec) -> torch.optim.Optimizer:
    """Every hyperparameter passed explicitly (torch AdamW defaults weight_decay to 0.01, optax to
    1e-4); the weight-decay mask as two param groups, from the rule optax's `mask=` uses
    (TrainSpec.decays)."""
    params = list(params)
    groups = [
        {"params": [p for p in params if train.decays(p.ndim)], "weight_decay": train.weight_decay},
        {"params": [p for p in params if not train.decays(p.ndim)], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    if train.optimizer == "adamw":
        return torch.optim.AdamW(
            groups, lr=train.lr, betas=(train.beta1, train.beta2), eps=train.eps, amsgrad=False
        )
    return torch.optim.SGD(
        groups, lr=train.lr, momentum=train.momentum, dampening=0.0, nesterov=train.nesterov
    )


def create_state(optimizer: torch.optim.Optimizer) -> None:
    """The optimizer's per-parameter state created now, with the values its first step would create
    (AdamW's moments and step count as torch.optim.adam's `_init_group` makes them, SGD's momentum
    buffers as zeros, which the first step turns into the gradient exactly: 0 * momentum + grad). A
    lazy or compiling runtime then traces one step graph from step 0 on, instead of one that creates
    the state and a second that reads it (a whole compile; torch_xla). Eager torch leaves it to the
    first step, as its users do."""
    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if state:
                continue
            if isinstance(optimizer, torch.optim.Adam):  # AdamW is an Adam
                on_device = group["capturable"] or group["fused"]
                state["step"] = (
                    torch.zeros((), dtype=scalar, device=p.device)
                    if on_device
                    else torch.tensor(0.0, dtype=scalar)
                )
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif isinstance(optimizer, torch.optim.SGD) and group["momentum"] != 0:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def set_lr(optimizer: torch.optim.Optimizer, train: TrainSpec, step: int) -> None:
    """The spec's lr of `step` on every param group, as nanoGPT does (`TrainSpec.lr_at`)."""
    for group in optimizer.param_groups:
        group["lr"] = train.lr_at(step)


def clip_gradients(parameters, train: TrainSpec) -> None:
    """Global-norm clip, torch's formula: scale by min(1, max_norm / (norm + 1e-6)); 0 turns it
    off."""
    if train.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(parameters, train.grad_clip)

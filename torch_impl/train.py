"""The pieces of a torch train step every torch runtime shares (the twin of `jax_impl/train.py`'s
`make_optimizer` and `cross_entropy`): optimizer from the spec, loss, lr schedule, gradient clip."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from common.spec import TrainSpec


def make_optimizer(params, train: TrainSpec) -> torch.optim.Optimizer:
    """Every hyperparameter passed explicitly (torch AdamW defaults weight_decay to 0.01, optax to 1e-4)."""
    if train.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=train.lr, betas=(train.beta1, train.beta2), eps=train.eps,
                                 weight_decay=train.weight_decay, amsgrad=False)
    return torch.optim.SGD(params, lr=train.lr, momentum=train.momentum, dampening=0.0,
                           weight_decay=train.weight_decay, nesterov=train.nesterov)


def cross_entropy(logits, targets):
    """Mean softmax cross-entropy over every position, in float32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1).long())


def set_lr(optimizer: torch.optim.Optimizer, train: TrainSpec, step: int) -> None:
    """The spec's lr of `step` on every param group, as nanoGPT does (`TrainSpec.lr_at`)."""
    for group in optimizer.param_groups:
        group["lr"] = train.lr_at(step)


def clip_gradients(parameters, train: TrainSpec) -> None:
    """Global-norm clip, torch's formula: scale by min(1, max_norm / (norm + 1e-6)); 0 turns it off."""
    if train.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(parameters, train.grad_clip)

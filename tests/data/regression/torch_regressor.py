"""A multi-target regressor as PyTorch users write one: an MLP with LayerNorm, trained with torch's
smooth L1 loss (its `beta` is the width of the quadratic zone)."""

import torch.nn.functional as F
from torch import nn

BETA = 0.5


class Regressor(nn.Module):
    def __init__(self, input_shape: int, hidden: int, num_outputs: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(input_shape, hidden),
            nn.LayerNorm(hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
        )
        self.head = nn.Linear(hidden, num_outputs)

    def forward(self, x):
        return self.head(self.body(x))


def smooth_l1(outputs, batch):
    return F.smooth_l1_loss(outputs, batch["targets"], beta=BETA)

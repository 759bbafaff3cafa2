"""A tiny ConvNeXt written the way torchvision/models/convnext.py writes it (by a new user, from the
README)."""

from functools import partial

import torch
from torch import nn
from torch.nn import functional as F


class Permute(nn.Module):  # torchvision.ops.misc.Permute
    def __init__(self, dims):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return torch.permute(x, self.dims)


class StochasticDepth(nn.Module):  # torchvision.ops.StochasticDepth (p=0 here)
    def __init__(self, p, mode):
        super().__init__()
        self.p = p
        self.mode = mode

    def forward(self, input):
        if not self.training or self.p == 0.0:
            return input
        survival_rate = 1.0 - self.p
        size = [input.shape[0]] + [1] * (input.ndim - 1) if self.mode == "row" else [1] * input.ndim
        noise = torch.empty(size, dtype=input.dtype, device=input.device).bernoulli_(survival_rate)
        if survival_rate > 0.0:
            noise.div_(survival_rate)
        return input * noise


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        x = x.permute(0, 3, 1, 2)
        return x


class CNBlock(nn.Module):
    def __init__(self, dim, layer_scale, stochastic_depth_prob, norm_layer=None):
        super().__init__()
        if norm_layer is None:
            norm_layer = partial(nn.LayerNorm, eps=1e-6)
        self.block = nn.Sequential(
            nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim, bias=True),
            Permute([0, 2, 3, 1]),
            norm_layer(dim),
            nn.Linear(in_features=dim, out_features=4 * dim, bias=True),
            nn.GELU(),
            nn.Linear(in_features=4 * dim, out_features=dim, bias=True),
            Permute([0, 3, 1, 2]),
        )
        self.layer_scale = nn.Parameter(torch.ones(dim, 1, 1) * layer_scale)
        self.stochastic_depth = StochasticDepth(stochastic_depth_prob, "row")

    def forward(self, input):
        result = self.layer_scale * self.block(input)
        result = self.stochastic_depth(result)
        result += input
        return result


class ConvNeXt(nn.Module):
    def __init__(
        self,
        input_shape=(3, 32, 32),
        num_classes=10,
        dims=(16, 32),
        depths=(1, 1),
        layer_scale=0.1,
        stochastic_depth_prob=0.0,
    ):
        super().__init__()
        norm_layer = partial(LayerNorm2d, eps=1e-6)
        in_ch = input_shape[0]
        layers = []
        # Conv2dNormActivation(3, dims[0], kernel_size=4, stride=4, padding=0,
        # norm_layer, activation_layer=None)
        layers.append(
            nn.Sequential(
                nn.Conv2d(in_ch, dims[0], kernel_size=4, stride=4, padding=0, bias=True),
                norm_layer(dims[0]),
            )
        )
        total_stage_blocks = sum(depths)
        stage_block_id = 0
        for i, (dim, depth) in enumerate(zip(dims, depths)):
            stage = []
            for _ in range(depth):
                sd_prob = (
                    stochastic_depth_prob * stage_block_id / (total_stage_blocks - 1.0)
                    if total_stage_blocks > 1
                    else 0.0
                )
                stage.append(CNBlock(dim, layer_scale, sd_prob))
                stage_block_id += 1
            layers.append(nn.Sequential(*stage))
            if i + 1 < len(dims):
                layers.append(
                    nn.Sequential(
                        norm_layer(dim),
                        nn.Conv2d(dim, dims[i + 1], kernel_size=2, stride=2),
                    )
                )
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            norm_layer(dims[-1]), nn.Flatten(1), nn.Linear(dims[-1], num_classes)
        )
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.features(x)
        x = self.avgpool(x)
        x = self.classifier(x)
        return x

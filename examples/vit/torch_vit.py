"""A Vision Transformer written as torchvision writes one (`torchvision.models.vision_transformer`):
a patch convolution, a class token, learned position embeddings, pre-norm encoder blocks around
`nn.MultiheadAttention(batch_first=True)` and an MLP block (`nn.Sequential` of Linear, exact GELU,
Dropout, Linear, Dropout), torchvision's module names
(`encoder.layers.encoder_layer_0.self_attention`).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn


class MLPBlock(nn.Sequential):
    def __init__(self, in_dim: int, mlp_dim: int, dropout: float):
        super().__init__(
            nn.Linear(in_dim, mlp_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_dim, in_dim),
            nn.Dropout(dropout),
        )


class EncoderBlock(nn.Module):
    def __init__(
        self,
        num_heads: int,
        hidden_dim: int,
        mlp_dim: int,
        dropout: float,
        attention_dropout: float,
    ):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden_dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(
            hidden_dim, num_heads, dropout=attention_dropout, batch_first=True
        )
        self.dropout = nn.Dropout(dropout)
        self.ln_2 = nn.LayerNorm(hidden_dim, eps=1e-6)
        self.mlp = MLPBlock(hidden_dim, mlp_dim, dropout)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x = self.ln_1(input)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x)
        x = x + input
        y = self.ln_2(x)
        y = self.mlp(y)
        return x + y


class Encoder(nn.Module):
    def __init__(
        self,
        seq_length: int,
        num_layers: int,
        num_heads: int,
        hidden_dim: int,
        mlp_dim: int,
        dropout: float,
        attention_dropout: float,
    ):
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, seq_length, hidden_dim).normal_(std=0.02))
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.Sequential(
            OrderedDict(
                (
                    f"encoder_layer_{i}",
                    EncoderBlock(num_heads, hidden_dim, mlp_dim, dropout, attention_dropout),
                )
                for i in range(num_layers)
            )
        )
        self.ln = nn.LayerNorm(hidden_dim, eps=1e-6)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        input = input + self.pos_embedding
        return self.ln(self.layers(self.dropout(input)))


class VisionTransformer(nn.Module):
    def __init__(
        self,
        image_size: int,
        patch_size: int,
        num_layers: int,
        num_heads: int,
        hidden_dim: int,
        mlp_dim: int,
        num_classes: int,
        in_channels: int = 3,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
    ):
        super().__init__()
        self.patch_size, self.hidden_dim = patch_size, hidden_dim
        self.conv_proj = nn.Conv2d(
            in_channels, hidden_dim, kernel_size=patch_size, stride=patch_size
        )
        seq_length = (image_size // patch_size) ** 2 + 1  # the patches and the class token
        self.class_token = nn.Parameter(torch.zeros(1, 1, hidden_dim))
        self.encoder = Encoder(
            seq_length, num_layers, num_heads, hidden_dim, mlp_dim, dropout, attention_dropout
        )
        self.heads = nn.Sequential(OrderedDict(head=nn.Linear(hidden_dim, num_classes)))

    def _process_input(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        x = self.conv_proj(x)  # (n, hidden_dim, h, w)
        return x.reshape(n, self.hidden_dim, -1).permute(0, 2, 1)  # (n, h * w, hidden_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._process_input(x)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.encoder(x)
        return self.heads(x[:, 0])


def vit(
    input_shape=(3, 16, 16),
    patch_size=4,
    num_layers=2,
    num_heads=4,
    hidden_dim=32,
    mlp_dim=64,
    num_classes=10,
) -> VisionTransformer:
    """The factory the twin names (as torchvision's `vit_b_16()`): channels and size from (C, H, W)
    images."""
    return VisionTransformer(
        input_shape[1],
        patch_size,
        num_layers,
        num_heads,
        hidden_dim,
        mlp_dim,
        num_classes,
        in_channels=input_shape[0],
    )

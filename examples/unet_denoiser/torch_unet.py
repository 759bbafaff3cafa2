"""A small DDPM-style denoising UNet written as a PyTorch user writes one: NCHW images,
`nn.Sequential` for the time MLP, `nn.ModuleList`s of ResBlocks and of resamplers, `F.silu`,
PyTorch's default initialisation.

Time: DDPM's sinusoidal embedding of t (dim = base_width; sin | cos of t * exp(-log(10000) i / (half
- 1))) -> Linear -> SiLU -> Linear (to 4 * base_width). ResBlock: GroupNorm -> SiLU -> Conv3x3 -> +
  Linear(temb)
broadcast over H, W -> GroupNorm -> SiLU -> Conv3x3, plus a 1x1 conv skip where the channels change.
One ResBlock per level, a stride-2 Conv3x3 (padding 1) down, a middle ResBlock, ConvTranspose2d(k=4,
s=2, p=1) up, skips joined by channel concatenation, then GroupNorm -> SiLU -> Conv3x3 to the
predicted noise.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def timestep_embedding(t: Tensor, dim: int) -> Tensor:
    """(B,) int -> (B, dim) in torch's default float (float32; float64 in a float64 run): sin | cos
    of t * exp(-log(10000) * i / (half - 1)), as DDPM."""
    half, dtype = dim // 2, torch.get_default_dtype()
    freqs = torch.exp(
        torch.arange(half, dtype=dtype, device=t.device) * (-math.log(10000.0) / (half - 1))
    )
    args = t.to(dtype)[:, None] * freqs[None, :]
    return torch.cat([torch.sin(args), torch.cos(args)], dim=1)


class ResBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, temb_ch: int, groups: int):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, in_ch)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.temb_proj = nn.Linear(temb_ch, out_ch)
        self.norm2 = nn.GroupNorm(groups, out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.skip = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else nn.Identity()

    def forward(self, x: Tensor, temb: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb_proj(temb)[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class UNet(nn.Module):
    def __init__(
        self, in_channels: int = 3, base_width: int = 16, channel_mults=(1, 2), groups: int = 8
    ):
        super().__init__()
        self.base_width = base_width
        temb_ch = 4 * base_width
        self.time_embed = nn.Sequential(
            nn.Linear(base_width, temb_ch), nn.SiLU(), nn.Linear(temb_ch, temb_ch)
        )
        self.conv_in = nn.Conv2d(in_channels, base_width, 3, padding=1)
        widths = [base_width * m for m in channel_mults]
        self.down_blocks, self.downsamples = nn.ModuleList(), nn.ModuleList()
        ch = base_width
        for i, w in enumerate(widths):
            self.down_blocks.append(ResBlock(ch, w, temb_ch, groups))
            ch = w
            if i < len(widths) - 1:
                self.downsamples.append(nn.Conv2d(ch, ch, 3, stride=2, padding=1))
        self.mid_block = ResBlock(ch, ch, temb_ch, groups)
        self.up_blocks, self.upsamples = nn.ModuleList(), nn.ModuleList()
        for i, w in reversed(list(enumerate(widths))):
            self.up_blocks.append(ResBlock(ch + w, w, temb_ch, groups))
            ch = w
            if i > 0:
                self.upsamples.append(nn.ConvTranspose2d(ch, ch, 4, stride=2, padding=1))
        self.norm_out = nn.GroupNorm(groups, ch)
        self.conv_out = nn.Conv2d(ch, in_channels, 3, padding=1)

    def forward(self, x: Tensor, t: Tensor) -> Tensor:  # x (B, C, H, W), t (B,) int -> (B, C, H, W)
        temb = self.time_embed(timestep_embedding(t, self.base_width))
        h = self.conv_in(x)
        skips = []
        for i, block in enumerate(self.down_blocks):
            h = block(h, temb)
            skips.append(h)
            if i < len(self.downsamples):
                h = self.downsamples[i](h)
        h = self.mid_block(h, temb)
        for i, block in enumerate(self.up_blocks):
            h = block(torch.cat([h, skips.pop()], dim=1), temb)
            if i < len(self.upsamples):
                h = self.upsamples[i](h)
        return self.conv_out(F.silu(self.norm_out(h)))


def unet(
    in_channels: int = 3,
    image_size: int = 16,
    base_width: int = 16,
    channel_mults=(1, 2),
    groups: int = 8,
) -> UNet:
    """The factory: `image_size` only checks that every level halves it evenly."""
    assert image_size % 2 ** (len(channel_mults) - 1) == 0, (image_size, channel_mults)
    return UNet(in_channels, base_width, tuple(channel_mults), groups)


def mse_loss(outputs: Tensor, batch) -> Tensor:
    """Mean squared error, in float32 (float64 in a float64 run), between the predicted noise (B, C,
    H, W) and batch["noise"]."""
    dtype = torch.float64 if outputs.dtype == torch.float64 else torch.float32
    return F.mse_loss(outputs.to(dtype), batch["noise"].to(dtype))

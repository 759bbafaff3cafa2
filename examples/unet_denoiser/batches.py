"""Numpy batches for a denoising (DDPM) task, no framework imported: noisy images, timesteps and the
noise.

x0 is a smooth synthetic image (a few coloured Gaussian blobs, clipped to [-1, 1]); t is uniform
over the `timesteps` of a linear beta schedule (1e-4 .. 0.02); x = sqrt(alpha_bar_t) x0 + sqrt(1 -
alpha_bar_t) noise. Everything is NCHW float32 (t int32), deterministic in (seed, step).
"""

from __future__ import annotations

import numpy as np


def alpha_bars(timesteps: int = 1000) -> np.ndarray:
    """The cumulative product of (1 - beta_t) of DDPM's linear schedule, float64."""
    return np.cumprod(1.0 - np.linspace(1e-4, 0.02, timesteps, dtype=np.float64))


def smooth_images(
    rng: np.random.Generator, batch_size: int, image_size: int, channels: int, n_blobs: int = 3
) -> np.ndarray:
    """(B, C, H, W) float64 images: each a sum of `n_blobs` Gaussian blobs of random centre, width
    and colour."""
    coords = (np.arange(image_size) + 0.5) / image_size
    yy, xx = np.meshgrid(coords, coords, indexing="ij")
    centres = rng.uniform(0.0, 1.0, (batch_size, n_blobs, 2))
    widths = rng.uniform(0.1, 0.3, (batch_size, n_blobs))
    colours = rng.uniform(-1.0, 1.0, (batch_size, n_blobs, channels))
    # (B, K, H, W)
    d2 = (yy - centres[..., 0, None, None]) ** 2 + (xx - centres[..., 1, None, None]) ** 2
    blobs = np.exp(-d2 / (2.0 * widths[..., None, None] ** 2))
    return np.clip(np.einsum("bkhw,bkc->bchw", blobs, colours), -1.0, 1.0)


def denoising_batch(
    seed: int, step: int, batch_size: int, image_size: int, channels: int = 3, timesteps: int = 1000
) -> dict[str, np.ndarray]:
    """{"x": noisy images (B, C, H, W) float32, "t": (B,) int32, "noise": (B, C, H, W) float32}."""
    rng = np.random.default_rng([seed, step])
    x0 = smooth_images(rng, batch_size, image_size, channels)
    t = rng.integers(0, timesteps, size=batch_size)
    noise = rng.standard_normal(x0.shape)
    ab = alpha_bars(timesteps)[t][:, None, None, None]
    x = np.sqrt(ab) * x0 + np.sqrt(1.0 - ab) * noise
    return {"x": x.astype(np.float32), "t": t.astype(np.int32), "noise": noise.astype(np.float32)}

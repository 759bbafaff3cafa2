"""The twin's own contrastive loss, on each side: the symmetric cross-entropy of the image-text
logits, each image matched to its own caption (the diagonal), as CLIP trains. `one_directional` is
the loss's mis-port: the images' direction alone."""

from __future__ import annotations


def torch_clip_loss(outputs, batch):
    import torch
    import torch.nn.functional as F

    logits = outputs["logits_per_image"]
    labels = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def nnx_clip_loss(outputs, batch):
    import jax.numpy as jnp
    import optax

    logits = outputs["logits_per_image"]
    labels = jnp.arange(logits.shape[0])
    return (
        optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        + optax.softmax_cross_entropy_with_integer_labels(logits.T, labels).mean()
    ) / 2


def nnx_one_directional(outputs, batch):
    import jax.numpy as jnp
    import optax

    logits = outputs["logits_per_image"]
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, jnp.arange(logits.shape[0])
    ).mean()

"""torchax backend: torch_impl's torch.nn models run on JAX through torchax. Imports torch, jax,
optax and torchax, never flax or torch_xla."""

"""PyTorch/XLA twin. Never imports jax."""

"""JAX / Flax NNX twin. Never imports torch."""

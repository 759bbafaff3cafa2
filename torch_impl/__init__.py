"""Plain torch.nn models, weight conversion and the train-step pieces every torch runtime shares.

Imports torch only, never torch_xla (or jax): eager PyTorch on the CPU runs it
as it is, and the torch_xla backend runs the same code on its XLA device.
"""

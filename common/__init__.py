"""The numpy-only contract both backends obey: specs, weights, data, sharding rules, run record.

Importing this package must never import jax or torch (tested).
"""

"""Batch sources for tests/test_tasks.py: one that is fine, and one for each way a source can go
wrong."""

import sys

import numpy as np


def good(seed, step, batch_size, features, conditions):
    rng = np.random.default_rng([seed, step])
    return {
        "x": rng.standard_normal((batch_size, features)).astype(np.float32),
        "c": rng.integers(0, conditions, batch_size).astype(np.int32),
        "target": rng.standard_normal((batch_size, features)).astype(np.float32),
    }


def shape_changes(seed, step, batch_size, features, conditions):
    batch = good(seed, step, batch_size, features, conditions)
    if step == 2:
        batch["x"] = np.zeros((batch_size, features + 1), np.float32)
    return batch


def nonfinite(seed, step, batch_size, features, conditions):
    batch = good(seed, step, batch_size, features, conditions)
    if step == 1:
        batch["target"][0, 0] = np.nan
    return batch


def out_of_range(seed, step, batch_size, features, conditions):
    batch = good(seed, step, batch_size, features, conditions)
    batch["c"][-1] = conditions
    return batch


def ignores_seed(seed, step, batch_size, features, conditions):
    batch = good(seed, step, batch_size, features, conditions)
    batch["x"] = np.random.default_rng().standard_normal((batch_size, features)).astype(np.float32)
    return batch


def float_ids(seed, step, batch_size, features, conditions):
    batch = good(seed, step, batch_size, features, conditions)
    batch["c"] = batch["c"].astype(np.float64)
    return batch


def beyond_int32(seed, step, batch_size, features, conditions):
    batch = good(seed, step, batch_size, features, conditions)
    batch["ids"] = np.full(batch_size, 2**40, np.uint64)
    return batch


def raises_at_step_3(seed, step, batch_size, features, conditions):
    if step == 3:
        raise ValueError("the shard for step 3 is missing")
    return good(seed, step, batch_size, features, conditions)


def exits_at_step_2(seed, step, batch_size, features, conditions):
    if step == 2:
        sys.exit("no more data")
    return good(seed, step, batch_size, features, conditions)


def extra_key(seed, step, batch_size, features, conditions):
    return {
        **good(seed, step, batch_size, features, conditions),
        "weights": np.ones(batch_size, np.float32),
    }

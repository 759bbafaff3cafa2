"""The batches a torch_xla run feeds its device loader: each replica's slice of every step's global
batch."""

from __future__ import annotations

import numpy as np
import torch

from common.data import process_slice
from common.provoke import provoked_batch
from torch_impl.train import torch_ints

# A twin's own named arrays go through the loader flat, "inputs/<key>" and "targets/<key>" (its
# input sharding takes one tensor per key), a 1-D array as (B, 1) under a marked key; `nested` gives
# the batch back as it was.
ONE_D = ":1d"


def nested(batch: dict) -> dict:
    """A loader batch as the trainer takes it: {"inputs", "targets"} of a built-in task as they are;
    a twin's own named arrays nested again, 1-D ones flat again."""
    if "inputs" in batch:
        return batch
    out = {"inputs": {}, "targets": {}}
    for key, tensor in batch.items():
        part, _, name = key.partition("/")
        out[part][name.removesuffix(ONE_D)] = tensor.reshape(-1) if name.endswith(ONE_D) else tensor
    return out


def flat(batch) -> dict[str, np.ndarray]:
    """A twin's own named batch as the loader carries it: {"inputs/<key>" or "targets/<key>": array,
    1-D ones as (B, 1) under a key marked ONE_D}."""
    return {
        f"{part}/{k}{ONE_D if v.ndim == 1 else ''}": v.reshape(len(v), -1) if v.ndim == 1 else v
        for part, arrays in (("inputs", batch.inputs), ("targets", batch.targets))
        for k, v in arrays.items()
    }


def flat_ndims(batch) -> dict[str, int]:
    """{loader key: its dimensions} of a global batch, for the loader's input sharding."""
    if not isinstance(batch.inputs, dict):
        return {"inputs": batch.inputs.ndim, "targets": 2}
    return {key: v.ndim for key, v in flat(batch).items()}


class StepBatches(torch.utils.data.Dataset):
    """Item i is this replica's slice of the global batch of step first_step + i."""

    def __init__(
        self,
        data,
        first_step: int,
        n_steps: int,
        replica: int = 0,
        replicas: int = 1,
        provocations=(),
    ):
        self.data, self.first_step, self.n_steps = data, first_step, n_steps
        self.replica, self.replicas, self.provocations = replica, replicas, list(provocations)

    # what building a batch raised, for `checked` to raise in the loop
    error: Exception | None = None

    def __len__(self) -> int:
        return self.n_steps

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        try:
            return self._batch(i)
        except Exception as e:
            # raised in MpDeviceLoader's thread, which ends the
            # iteration instead: the loop raises it
            self.error = e
            raise

    def checked(self, loader):
        """Iterate a device loader of these batches, as the loader carries them (`nested` makes them
        the trainer's); an exception a loader thread met building one is raised here, as itself (a
        bad input stays a usage error, not `StopIteration`)."""
        count = 0
        for batch in loader:
            count += 1
            yield batch
        if self.error is not None:
            raise self.error
        if count < self.n_steps:
            raise RuntimeError(f"the device loader stopped after {count} of {self.n_steps} batches")

    def _batch(self, i: int) -> dict[str, torch.Tensor]:
        step = self.first_step + i
        batch = provoked_batch(self.data.global_batch(step), step, self.provocations, np.int64)
        batch = process_slice(batch, self.replica, self.replicas)
        # Targets go at least 2-D ((B, 1) for classifiers; the loss flattens them):
        # torch_xla 2.9's MpDeviceLoader fails on 1-D tensors with an input ShardingSpec
        # ("too many indices for tensor of dimension 1"), while mark_sharding works.
        # a twin's own named arrays: flat, each at least 2-D (below)
        if isinstance(batch.inputs, dict):
            return {
                key: torch.from_numpy(np.ascontiguousarray(torch_ints(v)))
                for key, v in flat(batch).items()
            }
        targets = batch.targets.reshape(len(batch.targets), -1)
        return {"inputs": torch.from_numpy(batch.inputs), "targets": torch.from_numpy(targets)}


def on_device(part, device):
    """A numpy array, or a twin's named arrays, as tensors on `device`."""
    if isinstance(part, dict):
        return {k: on_device(torch_ints(v), device) for k, v in part.items()}
    return torch.from_numpy(part).to(device)

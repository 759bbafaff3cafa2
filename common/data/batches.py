"""A twin's own batches (task `custom`): named arrays from a numpy function the user writes once, or
from an .npz of named arrays, fed to each side's forward by name.

    # batches.py (numpy only; the twin names it as
    # data=DataSpec(dataset="batches", path="batches.py:denoising"))

    def denoising(seed, step, batch_size, image_size):   # hyperparameters it names are passed to it
        rng = np.random.default_rng([seed, step])
        return {"x": ..., "t": ..., "noise": ...}       # the global batch of `step`, any dtypes

Every key is a keyword of the forward except the twin's `loss_keys` (the ones only the loss reads).
A batch keeps its keys, shapes and dtypes from step to step, its float arrays are finite and its
integer arrays stay in the twin's declared `ranges` ({key: (low, high)}, high excluded; a bound may
name a hyperparameter): each batch is checked as it is drawn, and the describe step draws every
step's before any backend trains, so a source that breaks these is one line (a DataError, exit 2)
before anything runs. Numpy only; the function is imported only in the processes that run the user's
code (the describe steps and the backends).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np

from common.data.batch import EPOCH_ORDER, Batch, DataError, seeded_rng
from common.files.fsutil import require_regular_file
from common.spec import RunSpec


def _split(arrays: dict, loss_keys: tuple, float_dtype) -> Batch:
    """The batch as both sides get it: its float arrays in the run's float width (float64 in a
    float64 run, else float32: a float64 source fed to a float32 run would reach torch as float64,
    which a float32 layer refuses, and JAX as float32), the loss's keys apart."""
    fed = {
        k: v.astype(float_dtype, copy=False) if v.dtype.kind == "f" else v
        for k, v in arrays.items()
    }
    return Batch(
        {k: v for k, v in fed.items() if k not in loss_keys},
        {k: v for k, v in fed.items() if k in loss_keys},
    )


INT32 = np.iinfo(np.int32)


class _Checked:
    """Draws a batch and checks it against step 0's keys, shapes and dtypes, the float arrays'
    finiteness and the declared integer ranges."""

    def __init__(self, spec: RunSpec, source: str):
        from common.twin import twin_of

        twin = twin_of(spec.model)
        self.source, self.loss_keys = source, tuple(twin.loss_keys)
        self.batch_size = spec.train.global_batch_size
        self.float_dtype = np.float64 if spec.train.dtype == "float64" else np.float32
        hparams = spec.model.hparams
        self.ranges = {
            k: tuple(hparams[b] if isinstance(b, str) else b for b in bounds)
            for k, bounds in twin.ranges.items()
        }
        self.first = None

    def arrays(self, step: int) -> dict:
        raise NotImplementedError

    def arrays_fed(self) -> dict:
        """{key: {shape, dtype, to}} of the batches drawn (the run record's extra.batch_arrays)."""
        return {
            k: {
                "shape": list(shape),
                "dtype": str(dtype),
                "to": "loss" if k in self.loss_keys else "forward",
            }
            for k, (shape, dtype) in (self.first or {}).items()
        }

    def global_batch(self, step: int) -> Batch:
        if self.first is None:
            first = self.arrays(0)
            self._check(0, first, None)
            self._check_first(first)
            self.first = {k: (v.shape, v.dtype) for k, v in first.items()}
            if step == 0:
                return _split(first, self.loss_keys, self.float_dtype)
        arrays = self.arrays(step)
        self._check(step, arrays, self.first)
        return _split(arrays, self.loss_keys, self.float_dtype)

    def _check_first(self, first: dict) -> None:
        """Step 0 names every loss key, and is drawn again alike: a source that draws otherwise in
        each process (an unseeded generator, the global one) would feed each backend other
        batches."""
        where = f"batch source {self.source}"
        missing = [k for k in self.loss_keys if k not in first]
        if missing:
            raise DataError(
                f"{where}: the twin's loss_keys name {missing[0]!r}, which it does not give (it "
                "gives "
                f"{', '.join(sorted(first))}); name in loss_keys only keys of its batches"
            )
        again = self.arrays(0)
        differs = next(
            (k for k in first if k not in again or not np.array_equal(first[k], again[k])), None
        )
        if differs is not None:
            raise DataError(
                f"{where}: step 0 drawn twice differs in {differs!r}; a batch source gives the "
                "same "
                "arrays for the same seed and step (draw from numpy.random.default_rng([seed, "
                "step]), "
                "not an unseeded or global generator)"
            )

    def _check(self, step: int, arrays, first) -> None:
        where = f"batch source {self.source}: step {step}"
        if (
            not isinstance(arrays, dict)
            or not arrays
            or not all(isinstance(k, str) for k in arrays)
        ):
            raise DataError(
                f"{where} gives a {type(arrays).__name__}; a batch source returns a dict of named "
                "numpy "
                "arrays"
            )
        for key, value in arrays.items():
            if (
                not isinstance(value, np.ndarray)
                or value.ndim == 0
                or value.dtype.kind not in "biuf"
            ):
                raise DataError(
                    f"{where}: {key!r} is a {type(value).__name__} of "
                    f"{getattr(value, 'dtype', '-')}; "
                    "every entry is a numpy array of numbers (bool, int or float) with the batch "
                    "first"
                )
            if len(value) != self.batch_size:
                raise DataError(
                    f"{where}: {key!r} has {len(value)} rows, the global batch is "
                    f"train.global_batch_size={self.batch_size}"
                )
        if first is not None:
            got = {k: (v.shape, v.dtype) for k, v in arrays.items()}
            if set(got) != set(first):
                raise DataError(
                    f"{where} gives the keys {sorted(got)}, step 0 gave {sorted(first)}; a batch "
                    "keeps "
                    "its keys from step to step"
                )
            changed = next((k for k in got if got[k] != first[k]), None)
            if changed:
                raise DataError(
                    f"{where}: {changed!r} is {got[changed][1]} {got[changed][0]}, at step 0 "
                    f"{first[changed][1]} {first[changed][0]}; a batch keeps its shapes and "
                    "dtypes from "
                    "step to step (pad to one length and pass the mask)"
                )
        for key, value in arrays.items():
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                raise DataError(
                    f"{where}: {key!r} holds a NaN or Inf; every float array must be finite"
                )
            if value.dtype.kind == "f" and key in self.ranges:
                raise DataError(
                    f"{where}: {key!r} is {value.dtype}, and its declared range (the twin's "
                    "ranges) "
                    "makes it ids: give it as an integer array"
                )
            if (
                value.dtype.kind in "iu"
                and value.size
                and (value.min() < INT32.min or value.max() > INT32.max)
            ):
                raise DataError(
                    f"{where}: {key!r} spans {value.min()}..{value.max()}, beyond int32 (JAX "
                    "computes "
                    "in int32 and would wrap them); give integers within int32"
                )
            if key in self.ranges and value.size:
                low, high = self.ranges[key]
                if value.min() < low or value.max() >= high:
                    raise DataError(
                        f"{where}: {key!r} spans {value.min()}..{value.max()}, outside its "
                        "declared "
                        f"range [{low}, {high}) (the twin's ranges)"
                    )


class BatchFunction(_Checked):
    """data.dataset=batches: `data.path` names the function, `file.py:name` (relative to the twin's
    file)."""

    def __init__(self, spec: RunSpec):
        super().__init__(spec, spec.data.path)
        from common.twin import TwinError, resolve, twin_of

        try:
            self.function = resolve(
                spec.data.path, twin_of(spec.model).base_dir, what="batch source"
            )
        except TwinError as e:
            raise DataError(str(e)) from None
        if not callable(self.function):
            raise DataError(
                f"batch source {spec.data.path} is a {type(self.function).__name__}, not a function"
            )
        taken = inspect.signature(self.function).parameters
        self.kwargs = {"seed": spec.data.seed, "batch_size": self.batch_size}
        self.kwargs.update(
            {k: v for k, v in spec.model.hparams.items() if k in taken and k not in self.kwargs}
        )

    def arrays(self, step: int) -> dict:
        try:
            return self.function(step=step, **self.kwargs)
        except SystemExit as e:  # sys.exit in the source: named, never taken for the factory's
            raise DataError(
                f"batch source {self.source}: step {step} called sys.exit({e.code!r}); a batch "
                "source returns its arrays (raise an exception to refuse a step)"
            ) from None
        except Exception as e:  # the user's code: named with its step, never the backend's crash
            first = str(e).splitlines()[0] if str(e) else ""
            raise DataError(
                f"batch source {self.source}: step {step} raised {type(e).__name__}"
                + (f": {first}" if first else "")
            ) from None


class NamedArrays(_Checked):
    """data.dataset=arrays for task custom: an .npz of named arrays (one row per example), visited
    in a fresh seeded permutation every epoch, as common.data's (x, y) arrays."""

    def __init__(self, spec: RunSpec):
        path = spec.data.path
        super().__init__(spec, path)
        require_regular_file(path, "arrays file", DataError)
        if not Path(path).is_file():
            raise DataError(f"arrays file {path} does not exist")
        try:
            with np.load(path) as f:
                self.named = {k: f[k] for k in f.files}
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read arrays file {path}: {e}") from None
        rows = {len(v) if v.ndim else 0 for v in self.named.values()}
        if len(rows) != 1 or 0 in rows:
            raise DataError(
                f"{path}: its arrays must all have the same number of rows (examples), found "
                f"{sorted(rows)}"
            )
        self.n, self.seed, self._orders = rows.pop(), spec.data.seed, {}

    def arrays(self, step: int) -> dict:
        flat = np.arange(step * self.batch_size, (step + 1) * self.batch_size)
        for epoch in {int(i) // self.n for i in flat}:
            if epoch not in self._orders:
                self._orders[epoch] = seeded_rng(self.seed, EPOCH_ORDER, epoch).permutation(self.n)
        idx = np.array([self._orders[i // self.n][i % self.n] for i in flat])
        return {k: v[idx] for k, v in self.named.items()}


def check_forward_keys(spec: RunSpec, forward, side: str) -> None:
    """Every key fed to the forward (all but the twin's loss_keys) must be one of its parameters,
    and every parameter it needs (no default) one of the keys."""
    batch = make_batches(spec).global_batch(0)
    params = inspect.signature(forward).parameters
    needed = [
        name
        for name, p in params.items()
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    missing = [k for k in needed if k not in batch.inputs]
    if missing:
        given = ", ".join(sorted(batch.inputs)) or "none"
        raise DataError(
            f"batch source {spec.data.path}: the forward of the {side} side needs {missing[0]!r}, "
            f"which the batches do not give (they give {given}"
            + (f"; {missing[0]!r} is a loss key" if missing[0] in batch.targets else "")
            + "); give it in every batch, or a default in the forward"
        )
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    unknown = [k for k in batch.inputs if k not in params]
    if unknown:
        raise DataError(
            f"batch source {spec.data.path}: the forward of the {side} side takes no argument "
            f"{unknown[0]!r} (it takes {', '.join(params) or 'none'}); name the keys only the loss "
            "reads in the twin's loss_keys"
        )


def make_batches(spec: RunSpec):
    """The twin's own batches of a custom task: its function (data.dataset=batches) or its .npz of
    named arrays."""
    return BatchFunction(spec) if spec.data.dataset == "batches" else NamedArrays(spec)


def check_every_step(spec: RunSpec) -> None:
    """Draw and check every step's batch and the held one after the last (the eval check's), as the
    run will."""
    source = make_batches(spec)
    for step in range(spec.train.steps + 1):
        source.global_batch(step)

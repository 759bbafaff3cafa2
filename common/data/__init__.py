"""Datasets and the deterministic global batch of every step.

`make_dataset(spec).global_batch(step)` returns the same arrays for the same
(dataset, data seed, step) on any machine and in any process: every random
draw comes from `np.random.default_rng([seed, stream, index])` (PCG64, which
numpy guarantees bit-stable across platforms), never from global state.
`process_slice` cuts the global batch into a process's contiguous share.

Batches are `Batch(inputs, targets)`:
  classification  inputs float32 (B, *input_shape), targets int32 (B,)
  regression      inputs float32 (B, *input_shape), targets float32 (B, num_outputs)
  tokens          inputs int32 (B, T), targets int32 (B, T) (inputs shifted by one)
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from common.data.batch import (
    CHAIN,
    EPOCH_ORDER,
    EXAMPLES,
    OFFSETS,
    TEACHER,
    Batch,
    DataError,
    seeded_rng,
)
from common.files.fsutil import require_regular_file
from common.spec import MLPSpec, RunSpec, TwinSpec
from common.weights import widened


def _input_shape(spec: RunSpec) -> tuple[int, ...]:
    m = spec.model
    return (m.input_size,) if isinstance(m, MLPSpec) else tuple(m.input_shape)


ACTIVATION_ROWS, ACTIVATION_TOKENS = 2, 64


def activation_inputs(spec: RunSpec, inputs, at: tuple[int, int] = (0, 0)):
    """The slice of step 0's inputs whose per-module activations are captured (and of its targets,
    whose loss the capture differentiates), small enough to keep for any model: 2 examples from row
    `at[0]` on (the last two where fewer are left); of a language model that row's sequence up to
    token `at[1]`, at least its first 64 tokens (it is causal: a prefix is computed as in the whole
    sequence). compare asks for the row and token where the two sides' step-0 logits differ most
    (compare/runs/capture_runs.py). A twin whose shard_map regions split the batch over the mesh
    (its NNX side takes the mesh: Twin.nnx_mesh_arg) gets a multiple of the ways its mesh splits
    it (data x fsdp): a region takes its rows over those axes."""
    row, token = at
    count = 1 if spec.is_language_model and not isinstance(inputs, dict) else ACTIVATION_ROWS
    count = math.lcm(count, _region_split(spec))

    def rows(v):
        start = max(0, min(row, len(v) - count))
        return np.ascontiguousarray(v[start : start + count])

    # a twin's own batch (common/data/batches.py): each named array's rows
    if isinstance(inputs, dict):
        return {k: rows(v) for k, v in inputs.items()}
    if spec.is_language_model:
        return np.ascontiguousarray(rows(inputs)[:, : max(ACTIVATION_TOKENS, token + 1)])
    return rows(inputs)


def _region_split(spec: RunSpec) -> int:
    """How many ways a twin's shard_map regions split a batch: its mesh's data x fsdp where its NNX
    side takes the mesh, else 1 (GSPMD shards any rows)."""
    from common.twin import twin_of

    takes_mesh = isinstance(spec.model, TwinSpec) and twin_of(spec.model).nnx_mesh_arg
    return spec.mesh.batch_replicas if takes_mesh else 1


def in_first_capture(language_model: bool, at: tuple[int, int]) -> bool:
    """Whether the slice `activation_inputs` takes by default, (0, 0), holds the example (row,
    token) `at`."""
    row, token = at
    return row == 0 and token < ACTIVATION_TOKENS if language_model else row < ACTIVATION_ROWS


def held_inputs(spec: RunSpec, data) -> np.ndarray:
    """The inputs of the eval-mode check: the capture's slice of the batch after the last step's,
    which no step trained on."""
    return activation_inputs(spec, data.global_batch(spec.train.steps).inputs)


def input_ndim(spec: RunSpec) -> int:
    """Dimensions of a batch's inputs: (B, T) tokens or (B, *input_shape)."""
    return 2 if spec.is_language_model else 1 + len(_input_shape(spec))


class SyntheticClassification:
    """Gaussian inputs labelled by a fixed random two-layer tanh teacher: learnable, endless."""

    def __init__(self, spec: RunSpec, outputs: int | None = None):
        self.batch_size = spec.train.global_batch_size
        self.shape = _input_shape(spec)
        self.seed = spec.data.seed
        n_in, n_hidden = int(np.prod(self.shape)), 64
        rng = seeded_rng(self.seed, TEACHER, 0)
        self.w1 = rng.standard_normal((n_in, n_hidden)) / np.sqrt(n_in)
        self.w2 = rng.standard_normal((n_hidden, outputs or spec.model.num_classes))

    def teacher(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        x = (
            seeded_rng(self.seed, EXAMPLES, step)
            .standard_normal((self.batch_size, *self.shape))
            .astype(np.float32)
        )
        return x, np.tanh(x.reshape(self.batch_size, -1).astype(np.float64) @ self.w1) @ self.w2

    def global_batch(self, step: int) -> Batch:
        x, logits = self.teacher(step)
        return Batch(x, logits.argmax(axis=1).astype(np.int32))


class SyntheticRegression(SyntheticClassification):
    """The same inputs and teacher, its outputs as the float targets (of unit scale)."""

    def __init__(self, spec: RunSpec):
        super().__init__(spec, outputs=spec.model.num_outputs)

    def global_batch(self, step: int) -> Batch:
        x, y = self.teacher(step)
        return Batch(x, (y / np.sqrt(self.w1.shape[1])).astype(np.float32))


def _labels(spec: RunSpec, y: np.ndarray, n: int, source: str) -> np.ndarray:
    if y.shape != (n,):
        raise DataError(f"{source}: labels have shape {y.shape}, expected ({n},)")
    classes = spec.model.num_classes
    if not np.issubdtype(y.dtype, np.integer) and not (
        np.isfinite(y).all() and (y == np.round(y)).all()
    ):
        raise DataError(
            f"{source}: labels are {y.dtype} with fractions or NaN, a classifier needs integer "
            "class ids "
            "(float targets are a regression's: a twin with task='regression')"
        )
    if n and (y.min() < 0 or y.max() >= classes):
        raise DataError(f"{source}: labels span {y.min()}..{y.max()}, model.num_classes={classes}")
    return y.astype(np.int32)


def _regression_targets(spec: RunSpec, y: np.ndarray, n: int, source: str) -> np.ndarray:
    outputs = spec.model.num_outputs
    if y.shape == (n,) and outputs == 1:
        y = y[:, None]
    if y.shape != (n, outputs):
        raise DataError(
            f"{source}: targets have shape {y.shape}, a regression with "
            f"model.num_outputs={outputs} "
            f"needs ({n}, {outputs})"
        )
    if not np.issubdtype(y.dtype, np.number) or not np.isfinite(y).all():
        bad = (
            "are not numbers"
            if not np.issubdtype(y.dtype, np.number)
            else f"hold a NaN or Inf (example {int(np.argwhere(~np.isfinite(y))[0][0])})"
        )
        raise DataError(f"{source}: targets {bad}; a regression needs finite float targets")
    return np.ascontiguousarray(y, dtype=np.float32)


class ArrayDataset:
    """A fixed (x, y) set visited in a fresh seeded permutation every epoch."""

    def __init__(self, spec: RunSpec, x: np.ndarray, y: np.ndarray, source: str):
        want = _input_shape(spec)
        if x.ndim == 2 and len(want) == 3 and x.shape[1] == int(np.prod(want)):
            x = x.reshape(len(x), *want)  # flat images for a CNN
        elif x.ndim == 4 and len(want) == 1 and int(np.prod(x.shape[1:])) == want[0]:
            x = x.reshape(len(x), -1)  # images for an MLP
        if tuple(x.shape[1:]) != want:
            raise DataError(
                f"{source}: inputs have shape {tuple(x.shape[1:])} per example, the model needs "
                f"{want}"
            )
        targets = _regression_targets if spec.task == "regression" else _labels
        y = targets(spec, y, len(x), source)
        if not np.isfinite(x).all():
            bad = int(np.argwhere(~np.isfinite(x.reshape(len(x), -1)))[0][0])
            raise DataError(
                f"{source}: example {bad} has a NaN or Inf input; clean the data (it would make "
                "the "
                "loss non-finite)"
            )
        self.x = np.ascontiguousarray(x, dtype=np.float32)
        self.y = y
        self.batch_size = spec.train.global_batch_size
        self.seed = spec.data.seed
        self._orders: dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders[epoch] = seeded_rng(self.seed, EPOCH_ORDER, epoch).permutation(len(self.x))
        return self._orders[epoch]

    def global_batch(self, step: int) -> Batch:
        n = len(self.x)
        flat = np.arange(step * self.batch_size, (step + 1) * self.batch_size)
        idx = np.array([self._order(i // n)[i % n] for i in flat])
        return Batch(self.x[idx], self.y[idx])


def _digits(spec: RunSpec) -> ArrayDataset:
    from sklearn.datasets import load_digits

    digits = load_digits()  # 1,797 real 8x8 images, grey levels 0..16
    images = (digits.images / 16.0).astype(np.float32)[..., None]  # NHWC
    return ArrayDataset(spec, images, digits.target, "digits")


def _npz(spec: RunSpec) -> ArrayDataset:
    path = spec.data.path
    require_regular_file(path, "arrays file", DataError)  # a FIFO would block the read forever
    try:
        with np.load(path) as f:
            if "x" not in f or "y" not in f:
                raise DataError(
                    f"{path}: an arrays file needs arrays named x and y, found {sorted(f.files)}"
                )
            x, y = f["x"], f["y"]
    except (OSError, ValueError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"cannot read arrays file {path}: {e}") from None
    return ArrayDataset(spec, x, y, path)


class TokenDataset:
    """Random windows of a token stream, nanoGPT style: targets are inputs shifted by one."""

    def __init__(self, spec: RunSpec, tokens: np.ndarray, source: str):
        self.tokens, self.source = tokens, source
        self.batch_size, self.seq_len = spec.train.global_batch_size, spec.seq_len
        self.vocab_size = spec.model.vocab_size
        self.seed = spec.data.seed
        if len(tokens) < self.seq_len + 2:
            raise DataError(
                f"{source}: {len(tokens)} tokens is too short for sequences of {self.seq_len}"
            )
        self._check_ids()

    def _check_ids(self, chunk: int = 1 << 24) -> None:
        """Every token id against the vocabulary, once, before any backend starts: a bad id found
        later, inside a framework's data-loader thread, would read as a crash of that framework. One
        pass over the stream in 16M-token chunks (a second or so per GB of tokens)."""
        for lo in range(0, len(self.tokens), chunk):
            part = np.asarray(self.tokens[lo : lo + chunk])
            low, high = int(part.min()), int(part.max())
            if low < 0 or high >= self.vocab_size:
                bad = lo + int(np.argmax((part < 0) | (part >= self.vocab_size)))
                raise DataError(
                    f"{self.source}: token id {int(self.tokens[bad])} at position {bad} is outside "
                    f"model.vocab_size={self.vocab_size}; use a matching model.vocab_size or "
                    "re-tokenize"
                )

    def global_batch(self, step: int) -> Batch:
        starts = seeded_rng(self.seed, OFFSETS, step).integers(
            0, len(self.tokens) - self.seq_len - 1, self.batch_size
        )
        windows = np.stack(
            [np.asarray(self.tokens[s : s + self.seq_len + 1]) for s in starts]
        ).astype(np.int32)
        return Batch(windows[:, :-1], windows[:, 1:])


class SyntheticTokens:
    """Sequences from a fixed sparse Markov chain: each token has 4 likely successors.

    The best achievable loss is the chain's entropy (about 1.13 nats), so a
    model that learns shows a falling loss well below log(vocab).
    """

    SUCCESSOR_PROBS = np.array([0.6, 0.2, 0.1, 0.1])

    def __init__(self, spec: RunSpec):
        self.batch_size, self.seq_len = spec.train.global_batch_size, spec.seq_len
        self.vocab_size, self.seed = spec.model.vocab_size, spec.data.seed
        rng = seeded_rng(self.seed, CHAIN, 0)
        self.successors = rng.integers(
            0, self.vocab_size, size=(self.vocab_size, len(self.SUCCESSOR_PROBS))
        )

    def global_batch(self, step: int) -> Batch:
        rng = seeded_rng(self.seed, EXAMPLES, step)
        b, t = self.batch_size, self.seq_len + 1
        seq = np.empty((b, t), np.int64)
        seq[:, 0] = rng.integers(0, self.vocab_size, b)
        choice = rng.choice(len(self.SUCCESSOR_PROBS), size=(b, t - 1), p=self.SUCCESSOR_PROBS)
        for i in range(1, t):
            seq[:, i] = self.successors[seq[:, i - 1], choice[:, i - 1]]
        seq = seq.astype(np.int32)
        return Batch(seq[:, :-1], seq[:, 1:])


def _token_file(spec: RunSpec) -> TokenDataset:
    path = spec.data.path
    require_regular_file(path, "tokens file", DataError)  # a FIFO would block the read forever
    if not Path(path).is_file():
        raise DataError(f"tokens file {path} does not exist")
    try:
        if path.endswith(".npy"):
            tokens = np.load(path, mmap_mode="r")
            if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
                raise DataError(
                    f"{path}: a .npy tokens file must be a 1-D integer array, "
                    f"got {tokens.dtype} of shape {tokens.shape}"
                )
        else:  # nanoGPT's train.bin: a flat uint16 stream
            tokens = np.memmap(path, dtype=np.uint16, mode="r")
    except (OSError, ValueError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"cannot read tokens file {path}: {e}") from None
    return TokenDataset(spec, tokens, path)


def make_dataset(spec: RunSpec):
    """The dataset object for a validated spec; `.global_batch(step)` gives a Batch (its float
    arrays widened exactly to float64 in a float64 run, here once for every backend)."""
    dataset = _dataset(spec)
    return Widened(dataset) if spec.train.state_dtype == "float64" else dataset


class Widened:
    """A dataset whose batches' float32 (and narrower) arrays come as float64: exact, the same
    values."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __getattr__(self, name):
        return getattr(self.dataset, name)

    def global_batch(self, step: int) -> Batch:
        def wide(part):  # an array, or a twin's named arrays
            return (
                widened(part, "float64")
                if isinstance(part, dict)
                else widened({"a": part}, "float64")["a"]
            )

        return Batch(*(wide(part) for part in self.dataset.global_batch(step)))


def _dataset(spec: RunSpec):
    kind = spec.data.dataset
    if kind == "batches" or spec.task == "custom":  # the twin's own named arrays
        from common.data.batches import make_batches

        return make_batches(spec)
    if kind == "synthetic-classification":
        return SyntheticClassification(spec)
    if kind == "synthetic-regression":
        return SyntheticRegression(spec)
    if kind == "digits":
        return _digits(spec)
    if kind == "arrays":
        return _npz(spec)
    if kind == "synthetic-tokens":
        return SyntheticTokens(spec)
    if kind == "tokens-file":
        return _token_file(spec)
    raise DataError(f"data.dataset={kind} is unknown")


def process_slice(batch: Batch, process_index: int, process_count: int) -> Batch:
    """This process's contiguous share of a global batch."""
    n = (
        len(next(iter(batch.inputs.values())))
        if isinstance(batch.inputs, dict)
        else len(batch.inputs)
    )
    if n % process_count:
        raise DataError(f"global batch {n} is not divisible by {process_count} processes")
    per = n // process_count
    lo = process_index * per
    return Batch(*(rows(part, lo, lo + per) for part in batch))


def rows(part, lo: int, hi: int):
    """Rows lo:hi of an array, or of every array of a twin's named batch."""
    return {k: v[lo:hi] for k, v in part.items()} if isinstance(part, dict) else part[lo:hi]

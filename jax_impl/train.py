"""The JAX train loop: optax from the spec, one jitted step with donation, timing.

Fast path: the NNX model is split once into (graphdef, params); the step is a
pure `jax.jit` over params, optimizer state and batch that merges the model
inside the trace. Default `nnx.jit` re-walks the object graph on every call
(~0.8 ms of Python per step on this CPU); a pure jit costs what plain JAX does.

bf16 policy (train.dtype=bfloat16): parameters and optimizer state stay
float32; modules compute in bfloat16 (their `dtype`); logits are cast to
float32 before the softmax cross-entropy.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from common.capture.activations import Capture, input_layout
from common.files.record import (
    RunExtra,
    RunRecord,
    dtype_counts,
    host_platform,
    numerics_env,
    package_versions,
    precision_numerics,
)
from common.sharding import param_partition_specs
from common.spec import RunSpec
from common.twin import twin_of, user_loss
from common.twin.outputs import array_outputs, forward, logits_of, loss_batch
from common.weights import widened
from common.weights.carried import start_info, start_state
from driver.harness import RunOptions
from jax_impl import convert, masks, sharding
from jax_impl.capture import capture_activations
from jax_impl.checkpoint_io import start_weights
from jax_impl.generate import generate_nnx
from jax_impl.instrument import CompileMonitor
from jax_impl.islands import float32_islands
from jax_impl.loop import JittedTrainer, in_bfloat16, jitted_mesh
from jax_impl.models import build_model, nnx_input_axes, nnx_inputs
from jax_impl.optim import make_optimizer
from jax_impl.sharding import StepBatch

SETTLE_STEPS = 1  # a fixed-shape jitted loop compiles once, at its first step


def loss_dtype(x):
    """float32 for bfloat16 or float32 values, float64 for float64 ones (a float64 run's loss)."""
    return jnp.promote_types(jnp.result_type(x), jnp.float32)


def cross_entropy(logits, targets):
    """Mean softmax cross-entropy over every position, in float32 (float64 in a float64 run)."""
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(loss_dtype(logits)), targets
    ).mean()


def mean_squared_error(predictions, targets):
    """Mean squared error over every element, in float32 (float64 in a float64 run)."""
    predictions = predictions.astype(loss_dtype(predictions))
    return jnp.mean(
        (predictions - targets.astype(predictions.dtype).reshape(predictions.shape)) ** 2
    )


def task_loss(spec: RunSpec):
    """`loss(outputs, batch) -> scalar` of the run, on the forward's whole output and batch =
    {"inputs": ..., "targets": ...}: the twin's own NNX loss, or the task's (cross-entropy or mean
    squared error of the output the twin's `logits` picks; the twin of
    torch_impl.train.task_loss)."""
    twin = twin_of(spec.model)
    if twin.loss:
        loss = user_loss(twin, "nnx")

        def own(outputs, batch):
            value = loss(outputs, batch)
            return jnp.asarray(value, loss_dtype(value))

        return own
    built_in = mean_squared_error if spec.task == "regression" else cross_entropy
    return lambda outputs, batch: built_in(logits_of(outputs, twin.logits), batch["targets"])


def in_this_trace(state):
    """`state` with its Variables made anew in the running trace. Dropout advances its RNG count; a
    Variable from an outer level (the jit's, inside value_and_grad) refuses that ("Cannot mutate
    RngCount from a different trace level")."""
    return jax.tree.map(lambda leaf: leaf, state)


class JaxTrainer(JittedTrainer):
    """The split NNX model, its optimizer state and jitted functions for one spec."""

    def __init__(self, spec: RunSpec, mesh, options: RunOptions, monitor: CompileMonitor):
        self.bind(spec, options, monitor, mesh)
        checkpoint = options.checkpoint
        compute_dtype = {"bfloat16": jnp.bfloat16, "float64": jnp.float64}.get(
            spec.train.dtype, jnp.float32
        )
        model = build_model(
            spec.model, compute_dtype, seed=spec.train.seed, dropout_seed=spec.train.mask_seed
        )
        self.input_axes, self.which = nnx_input_axes(spec), twin_of(spec.model).logits
        self.loss_fn, self.output_axes = task_loss(spec), tuple(twin_of(spec.model).nnx_output_axes)
        self.graphdef, abstract, self.rest = nnx.split(model, nnx.Param, ...)
        started = time.perf_counter()
        canonical = widened(start_weights(spec, checkpoint), spec.train.state_dtype)
        if spec.train.loads_bfloat16:  # param_dtype=bfloat16, rounded to nearest as torch's copy
            canonical = in_bfloat16(canonical)
        self.rest = convert.load_state(self.rest, start_state(checkpoint))  # in the state's dtype
        self.start_buffers = convert.held_buffers(self.rest)  # what training may change
        self.param_shardings = sharding.param_shardings(spec.model, spec.mesh, mesh)
        self.params = convert.load_canonical(abstract, canonical, spec.model, self.param_shardings)
        jax.block_until_ready(self.params)
        self.start = start_info(checkpoint, time.perf_counter() - started)
        self.tx = make_optimizer(spec.train)
        # RNG state of dropout (and any other non-parameter state), threaded by the step
        self.state = self.rest
        self.compile_functions(mesh)

    def fed_dropout(self, feed):
        return masks.fed_dropout(feed)

    def torch_layout(self, output):
        """The forward's output in the torch side's layout (the twin's nnx_output_axes), to be
        compared."""
        return output.transpose(self.output_axes) if self.output_axes else output

    def _loss_and_aux(self, params, state, batch: StepBatch):
        model = nnx.merge(self.graphdef, params, in_this_trace(state))
        fed, seen = self.nnx_batch(batch.inputs, batch.targets)
        out = forward(model, fed)
        outputs = array_outputs(out, self.which)
        return self.loss_fn(out, seen), (
            nnx.state(model, nnx.Not(nnx.Param)),
            {**outputs, "logits": self.torch_layout(outputs["logits"])},
        )

    def nnx_batch(self, inputs, targets) -> tuple:
        """(what the forward is fed, what the loss sees) as the NNX side takes them: the inputs
        transposed by the twin's nnx_input_axes; a built-in task's loss sees the batch as the task
        makes it, a twin's own named arrays are each transposed by the axes it names, the loss's
        keys too."""
        fed = nnx_inputs(inputs, self.input_axes)
        if self.spec.train.loads_bfloat16:  # as torch's side is fed (torch_impl.models.as_fed)
            fed = in_bfloat16(fed)
        if isinstance(targets, dict):
            return fed, loss_batch(fed, nnx_inputs(targets, self.input_axes))
        return fed, loss_batch(inputs, targets)

    def canonical_state(self) -> dict[str, np.ndarray]:
        return self.to_canonical(nnx.filter_state(self.state, nnx.BatchStat), "state")

    def trained_buffers(self) -> tuple[dict, list[str]]:
        held = convert.held_buffers(self.state)  # compared on the devices, where the start's stayed
        return self.kept(held, "buffers"), convert.changed_buffers(self.start_buffers, held)

    def _eval_forward(self, params, state, inputs):
        model = nnx.merge(self.graphdef, params, in_this_trace(state))
        model.eval()
        return self.torch_layout(
            logits_of(forward(model, nnx_inputs(inputs, self.input_axes)), self.which)
        )

    def _activations(self, inputs: np.ndarray, targets: np.ndarray) -> Capture:
        fed, seen = self.nnx_batch(*jax.tree.map(jnp.asarray, (inputs, targets)))
        # as training left it
        return capture_activations(
            nnx.merge(self.graphdef, self.params, self.state),
            fed,
            input_layout(self.input_axes),
            lambda out: self.loss_fn(out, seen),
            masks=self.capture_masks,
        )

    def generate(self, tokens, mask, n_new: int, forced=None, capture_at=None) -> dict:
        """The twin's NNX decode path on the start weights (common/generation.py)."""
        model = nnx.merge(self.graphdef, self.params, self.state)
        out, self.decode_how = generate_nnx(
            self.spec, model, tokens, mask, n_new, forced, self.monitor.events, capture_at
        )
        return out

    def float32_islands(self, inputs, targets) -> tuple[dict[str, str], dict[str, int]]:
        fed, seen = self.nnx_batch(*jax.tree.map(jnp.asarray, (inputs, targets)))
        model = nnx.merge(self.graphdef, self.params, self.rest)
        return float32_islands(model, fed, lambda out: self.loss_fn(out, seen))

    def new_record(self) -> RunRecord:
        spec = self.spec
        devices = jax.devices()
        precision = spec.train.matmul_precision
        return RunRecord(
            backend="jax",
            spec=spec.to_dict(),
            versions=package_versions("jax", "jaxlib", "flax", "optax"),
            platform={
                **host_platform(),
                "device_platform": devices[0].platform,
                "device_kind": devices[0].device_kind,
                "device_count": len(devices),
                "process_count": jax.process_count(),
            },
            numerics={
                "dtype": spec.train.dtype,
                "matmul_precision": precision,
                "jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
                **precision_numerics(
                    spec.train,
                    "float32 params and optimizer state, bfloat16 module compute, float32 loss",
                ),
                "grad_clip": "torch formula: min(1, max_norm / (norm + 1e-6))",
                "weight_decay_applies_to": spec.train.decay_applies_to,
                "env": numerics_env(),
            },
            settle_steps=SETTLE_STEPS,
            param_dtypes=dtype_counts(x.dtype for x in jax.tree.leaves(self.params)),
            extra=RunExtra(
                notes={
                    "step_api": "jax.jit(pure step over nnx.split state, donate params and "
                    "optimizer state)",
                    "mesh_strategy": spec.mesh.strategy,
                    "nnx_input_axes": list(nnx_input_axes(spec)),
                },
                shards=placed_shards(spec),
            ),
        )

    def to_canonical(self, tree, group: str = "") -> dict:
        """{canonical name: host array, or its summary or shards (JittedTrainer.kept)}."""
        return self.kept(convert.to_canonical(tree), group)


def placed_shards(spec: RunSpec) -> dict | None:
    """How the parameters were placed on a mesh of more than one device (RunExtra.shards)."""
    if spec.mesh.device_count == 1:
        return None
    specs = param_partition_specs(spec.model, spec.mesh)
    return {
        "mesh": spec.mesh.shape,
        "params": {
            name: [list(a) if isinstance(a, tuple) else a for a in p]
            for name, p in specs.items()
            if any(a is not None for a in p)
        },
    }


def make_trainer(spec: RunSpec, options: RunOptions, monitor: CompileMonitor) -> JaxTrainer:
    """The run's trainer (driver.harness.run builds it after the process is ready)."""
    return JaxTrainer(spec, jitted_mesh(spec), options, monitor)

"""The torchax train loop: torch_impl's nn.Module on JAX, one jitted step with donation, timing.

`torchax.extract_jax(model)` gives the module's weights as JAX arrays keyed by
state_dict names and a JAX function that runs its `forward` (torch code,
traced through torchax's JAX lowering of every aten op). The loss is
torch_impl's `task_loss`, run by torchax in the same forward.

Optimizer: optax with torch's semantics (`jax_impl.optim`, the JAX twin's),
applied to the extracted weights inside the jitted step. This is torchax's
own training recipe (`torchax.train.make_train_step` takes an optax
optimizer): `torch.optim` mutates parameters in place from Python, which a
jitted pure step cannot trace, and running it eagerly through torchax would
dispatch op by op. Recorded as `extra.optimizer`.

bf16 policy (train.dtype=bfloat16), the JAX twin's: float32 parameters and
optimizer state; inside the step the float parameters, buffers and inputs are
cast to bfloat16 before the torch forward runs, and the loss is float32.
torchax 0.0.13's own autocast (`torchax.amp.autocast`) is not used: it casts
`torch.matmul` to bfloat16 but leaves `F.linear` in float32 (measured), so a
run under it computes its Linear layers in float32.
"""

from __future__ import annotations

import copy
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torchax
from torchax import interop

from common.capture.activations import Capture, kept_float, torch_output_layout
from common.files.record import (
    RunExtra,
    RunRecord,
    dtype_counts,
    host_platform,
    numerics_env,
    package_versions,
    precision_numerics,
)
from common.spec import RunSpec
from common.twin import twin_of
from common.twin.outputs import array_outputs, loss_batch
from common.weights.carried import start_info, start_state
from driver.harness import RunOptions
from jax_impl import sharding
from jax_impl.instrument import CompileMonitor
from jax_impl.loop import JittedTrainer, in_bfloat16, jitted_mesh
from jax_impl.optim import make_optimizer
from jax_impl.sharding import StepBatch
from torch_impl import masks
from torch_impl.capture import capture_activations
from torch_impl.checkpoint_io import start_weights
from torch_impl.convert import (
    canonical_buffers,
    canonical_state,
    changed_buffers,
    correspondence,
    load_start,
    modules_to_canonical,
    to_canonical,
)
from torch_impl.generate import generate_torch
from torch_impl.islands import float32_islands, host_tensors
from torch_impl.models import build_model
from torch_impl.train import task_loss
from torch_impl.widen import widen_if_asked
from torchax_impl.batch_norm import keep_running_statistics
from torchax_impl.embedding import honour_padding_idx
from torchax_impl.sharding import param_shardings

SETTLE_STEPS = 1  # one jitted step: it compiles at step 0 and never again


def batch_norm_buffers(model: torch.nn.Module) -> set[str]:
    """The buffers a train-mode forward updates: every batch norm's running mean, variance and
    count."""
    return {
        f"{name}.{buffer}"
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
        for buffer, value in module.named_buffers(recurse=False)
        if value is not None
    }


class TorchaxTrainer(JittedTrainer):
    """The extracted weights, optimizer state and jitted functions of one spec."""

    def __init__(self, spec: RunSpec, mesh, options: RunOptions, monitor: CompileMonitor):
        self.bind(spec, options, monitor, mesh)
        checkpoint = options.checkpoint
        model = build_model(spec.model, spec.train.seed, spec.train.param_dtype)
        # the checkpoint's read and conversion, not the model's construction
        started = time.perf_counter()
        model = load_start(
            model, start_weights(model, spec, checkpoint), start_state(checkpoint), spec.model
        )
        self.correspondence = correspondence(model, spec.model)
        self.model, self.module_names = model, modules_to_canonical(model, spec.model)
        self.which = twin_of(spec.model).logits  # which of the forward's outputs is the logits
        self.loss_fn = task_loss(spec)  # torch code, run inside the forward's torchax environment
        states, _ = torchax.extract_jax(model)  # parameters and buffers, by state_dict name
        keep_running_statistics(torchax.default_env())
        if "embedding-padding-idx" in options.match_behaviours:
            honour_padding_idx(torchax.default_env())
        shardings = param_shardings(model, spec.model, spec.mesh, mesh)
        self.params = {
            k: sharding.place(v, shardings[k]) for k, v in states.items() if k in shardings
        }
        # buffers (a rotary table, say) are inputs of the forward, never trained; BatchNorm's
        # running statistics change with every train-mode forward and
        # go through the step as its state
        running = batch_norm_buffers(model)
        self.buffers = {
            k: sharding.place(v, sharding.replicated(mesh))
            for k, v in states.items()
            if k not in shardings and k not in running
        }
        start_statistics = {k: v for k, v in states.items() if k in running}
        jax.block_until_ready(self.params)
        self.start = start_info(checkpoint, time.perf_counter() - started)
        self.tx = make_optimizer(spec.train)
        # torchax draws torch's random ops (dropout) from a key in its environment, which it rotates
        # in Python: inside a jitted step that would leak a tracer, so the
        # key is the step's state instead
        self.state = {"prng": jax.random.key(spec.train.mask_seed), "running": start_statistics}
        self.updated_buffers = self._carry_updated_buffers()
        self.start_buffers = self.canonical_buffers()  # what training may change (host copies)
        self.compile_functions(mesh)

    def _carry_updated_buffers(self) -> list[str]:
        """The buffers besides BatchNorm's that a train-mode forward changes in place (an EMA, a
        counter), moved from the step's constants to its state beside the running statistics:
        torchax writes the change into the traced tensor, which the step would drop where eager
        torch keeps it. Found by tracing step 0's loss once, abstractly (jax.eval_shape: nothing
        compiled or computed)."""
        if not self.buffers:
            return []
        held, self.buffers, changed = self.buffers, {}, set()

        def probe(params, running, batch):
            _, (state, _) = self._loss_and_aux(params, {**self.state, "running": running}, batch)
            changed.update(k for k in held if state["running"][k] is not running[k])

        try:
            jax.eval_shape(
                probe,
                self.params,
                {**self.state["running"], **held},
                StepBatch(*self.data.global_batch(0)),
            )
        # a forward that cannot be traced fails at step 0 as the run reports it, not here
        except Exception:
            changed.clear()
        self.buffers = {k: v for k, v in held.items() if k not in changed}
        self.state["running"].update({k: held[k] for k in changed})
        return sorted(changed)

    # the masks reach torch's dropout as torchax tensors
    mask_array = staticmethod(interop.torch_view)

    def fed_dropout(self, feed):
        return masks.fed_dropout(feed)

    def _call(self, states: dict, inputs, running: dict, *, training: bool = True, targets=None):
        """The torch module's forward over `states` (jax arrays by state_dict name;
        torchax.extract_jax's call, in `training` mode): its array outputs by name
        (common.twin.outputs.array_outputs), with `targets` after the run's loss (task_loss, in
        torch on the forward's whole output), and the running statistics as the forward left
        them."""
        env = torchax.default_env()
        tensors, inputs = env.j2t_iso(({**states, **running}, inputs))
        args, kwargs = ((), inputs) if isinstance(inputs, dict) else ((inputs,), None)
        self.model.train(training)
        try:
            with env:
                # tied weights stay tied
                out = torch.func.functional_call(self.model, tensors, args, kwargs)
                result = (
                    array_outputs(out, self.which)
                    if targets is None
                    else (
                        self.loss_fn(out, loss_batch(inputs, env.j2t_iso(targets))),
                        array_outputs(out, self.which),
                    )
                )
        finally:
            self.model.train()
        return env.t2j_iso(result), {k: env.t2j_iso(tensors[k]) for k in running}

    def _loss_and_aux(self, params, state, batch: StepBatch):
        env = torchax.default_env()
        with env.override_property(prng=state["prng"]):
            states, inputs = self._in_compute_dtype({**params, **self.buffers}, batch.inputs)
            (loss, outputs), running = self._call(
                states, inputs, state["running"], targets=batch.targets
            )
            key = env.prng_key
        return loss, ({"prng": key, "running": running}, outputs)

    def canonical_state(self) -> dict[str, np.ndarray]:
        return canonical_state(
            {k: sharding.to_host(v) for k, v in self.state["running"].items()}, self.module_names
        )

    def canonical_buffers(self) -> dict[str, np.ndarray]:
        return canonical_buffers({k: sharding.to_host(v) for k, v in self.held_buffers().items()})

    def held_buffers(self) -> dict[str, jax.Array]:
        """Every buffer but the running statistics, by state_dict name: the step's constants, and
        the ones a train-mode forward updates from its state."""
        return {**self.buffers, **{k: self.state["running"][k] for k in self.updated_buffers}}

    def trained_buffers(self) -> tuple[dict, list[str]]:
        kept = self.canonical_buffers()  # host copies, made once
        return kept, changed_buffers(self.start_buffers, kept)

    def _eval_forward(self, params, state, inputs):
        states, inputs = self._in_compute_dtype({**params, **self.buffers}, inputs)
        return self._call(states, inputs, state["running"], training=False)[0]["logits"]

    def _in_compute_dtype(self, states, inputs):
        """(weights and buffers, inputs) as a bfloat16 forward takes them: the inputs' floats in
        bfloat16, and the weights' and buffers' too where they are float32 (autocast: gradients
        flow back to the float32 params); a model loaded in bfloat16 keeps its buffers' own
        dtypes, as torch runs it."""
        train = self.spec.train
        if train.dtype != "bfloat16":
            return states, inputs
        return (states if train.loads_bfloat16 else in_bfloat16(states)), in_bfloat16(inputs)

    def _activations(self, inputs: np.ndarray, targets: np.ndarray) -> Capture:
        """Module activations from the torch module run eagerly by torchax (forward hooks see
        torchax tensors); called before any update, when the module still holds the starting
        weights."""
        # (copied outside torchax's environment)
        env, model = torchax.default_env(), copy.deepcopy(self.model)
        with env, self.capture_masks():
            # a copy: Module.to moves in place, and the run's own model moved to torchax
            model = model.to("jax")
            # tensors trained otherwise (HF's BERT: step 1's loss 4e-3 off)
            # the step's policy: float weights and inputs in bf16
            if self.spec.train.dtype == "bfloat16" and not self.spec.train.loads_bfloat16:
                model = model.to(torch.bfloat16)
            # no gradients: torch's autograd does not run on torchax tensors (its probes' .grad stay
            # empty; the step differentiates through JAX, which also never calls a custom
            # autograd.Function's backward)
            return capture_activations(
                model,
                env.j2t_iso(self._in_compute_dtype({}, jax.tree.map(jnp.asarray, inputs))[1]),
                self.module_names,
                to_numpy=lambda t: kept_float(env.t2j_iso(t)),
                output_layout=torch_output_layout(twin_of(self.spec.model).nnx_output_axes),
            )

    def generate(self, tokens, mask, n_new: int, forced=None, capture_at=None) -> dict:
        """The torch model's decode path run by torchax, eagerly, on a copy of the start weights
        (common/generation.py): a Hugging Face model's StaticCache, as on torch_xla. Each op torchax
        runs is a JAX program compiled for its shapes; a DynamicCache grows them every token, and
        every op of every step compiled again (1.4 s a step on the tiny Llama in float64; 0.05 s
        with the static cache's fixed shapes, measured)."""
        env, model = torchax.default_env(), copy.deepcopy(self.model)
        self.decode_how = "eager: op by op through torchax, a StaticCache (fixed shapes)"
        with env:
            model = model.to("jax")
            if self.spec.train.dtype == "bfloat16" and not self.spec.train.loads_bfloat16:
                model = model.to(torch.bfloat16)
            return generate_torch(
                self.spec,
                model,
                "jax",
                tokens,
                mask,
                n_new,
                forced,
                to_numpy=lambda t: kept_float(env.t2j_iso(t)),
                static=True,
            )

    def float32_islands(self, inputs, targets) -> tuple[dict[str, str], dict[str, int]]:
        inputs, targets = host_tensors(inputs), host_tensors(targets)  # for its CPU torch model
        return float32_islands(
            self.model,
            inputs,
            self.module_names,
            lambda out: self.loss_fn(out, loss_batch(inputs, targets)),
        )

    def new_record(self) -> RunRecord:
        spec = self.spec
        devices = jax.devices()
        return RunRecord(
            backend="torchax",
            spec=spec.to_dict(),
            versions=package_versions("torch", "torchax", "jax", "jaxlib", "optax"),
            platform={
                **host_platform(),
                "device_platform": devices[0].platform,
                "device_kind": devices[0].device_kind,
                "device_count": len(devices),
                "process_count": jax.process_count(),
            },
            numerics={
                "dtype": spec.train.dtype,
                "matmul_precision": spec.train.matmul_precision,
                "jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
                **precision_numerics(
                    spec.train,
                    "float32 params and optimizer state, float params, buffers and inputs cast to "
                    "bfloat16 for the forward (the JAX twin's module-dtype policy), float32 loss",
                ),
                "grad_clip": "torch formula: min(1, max_norm / (norm + 1e-6))",
                "weight_decay_applies_to": spec.train.decay_applies_to,
                "env": numerics_env(),
            },
            settle_steps=SETTLE_STEPS,
            param_dtypes=dtype_counts(x.dtype for x in jax.tree.leaves(self.params)),
            extra=RunExtra(
                notes={
                    "optimizer": "optax with torch's semantics (jax_impl.optim) on the extracted "
                    "weights, inside the "
                    "jitted step: torchax's own training recipe; torch.optim's in-place Python "
                    "updates "
                    "cannot be traced into one jitted step",
                    "step_api": "jax.jit(value_and_grad over torchax.extract_jax weights + optax, "
                    "donated)",
                    "mesh_strategy": spec.mesh.strategy,
                }
            ),
        )

    def to_canonical(self, tree, group: str = "") -> dict:
        """{canonical name: host array}; where a tensor is kept as a summary or no process holds it
        whole, the canonical layout is made on the devices and the tensor kept as the JAX twin keeps
        it (JittedTrainer.kept)."""
        if not self.on_device(tree, group):
            return to_canonical(
                {k: sharding.to_host(v) for k, v in tree.items()}, self.correspondence
            )
        with self.monitor.analysis():  # the layout's transposes
            canonical = self.correspondence.to_canonical(tree, xp=jnp)
        return self.kept(canonical, group)


def make_trainer(spec: RunSpec, options: RunOptions, monitor: CompileMonitor) -> TorchaxTrainer:
    """The run's trainer (driver.harness.run builds it after the process is ready)."""
    # cross_entropy casts the targets to torch's index dtype, int64; JAX without x64 keeps int32
    # (every class and token id fits) and would warn at each trace
    warnings.filterwarnings(
        "ignore", message="Explicitly requested dtype int64", category=UserWarning
    )
    widen_if_asked(spec)  # torch's casts; jitted_mesh widens JAX's (torchax's lowerings)
    return TorchaxTrainer(spec, jitted_mesh(spec), options, monitor)

"""The trainer of every runtime that trains through one jitted JAX step: the JAX twin and torchax.

Plain JAX (never flax): a runtime's trainer derives from `JittedTrainer`, which implements
driver.harness.Runtime for both: the optimizer placement, the jitted step, the batches on the mesh,
the timed step, the pipelined throughput, the profile and the HLO statistics are the same for all of
them.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from common.capture.activations import Capture
from common.data import Batch, held_inputs, make_dataset
from common.data.masks import MaskFeed, draw_masks, drawing_feed, given_feed
from common.files.record import RunRecord, pipelined_steps, throughput_summary
from common.files.tensor_file import summarized
from common.provoke import provoked_batch, python_value, with_python_value
from common.spec import RunSpec
from common.vocab import PROFILE_DIR, MaskSource, Phase, ProfileRange, RecordStatus
from driver.harness import RunOptions, refuse_float64_on
from jax_impl import sharding
from jax_impl.instrument import CompileMonitor, hlo_statistics
from jax_impl.sharding import StepBatch
from jax_impl.summary import device_summary
from jax_impl.widen import widen_if_asked

# a trace that meets a value-dependent branch or conversion (the subclasses of
# ConcretizationTypeError among them)
UNTRACEABLE = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerArrayConversionError,
)


def in_bfloat16(tree):
    """`tree` with its float arrays (numpy or JAX) cast to bfloat16, rounded to nearest even."""
    return jax.tree.map(
        lambda x: x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
    )


def jitted_mesh(spec: RunSpec):
    """What a jitted runtime sets before its trainer: JAX's matmul precision and, in a float64 run,
    64-bit types (before anything is traced) from the spec; returns the mesh."""
    refuse_float64_on(jax.default_backend(), spec)
    if spec.train.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    widen_if_asked(spec)
    if spec.train.matmul_precision != "default":
        jax.config.update("jax_default_matmul_precision", spec.train.matmul_precision)
    return sharding.make_mesh(spec.mesh)


class JittedTrainer:
    """What every one-jitted-step trainer shares: optimizer state placed like its parameters, the
    jitted step with donation, loss-and-grads, the step-0 parity tensors, and
    driver.harness.Runtime. A runtime calls `bind(spec, options, monitor, mesh)` first, sets
    `params` (placed on `mesh`), `state`, `tx` and `start` (common.weights.start_info), calls
    `compile_functions(mesh)`, and defines `_loss_and_aux(params, state, batch) -> (loss, (state,
    outputs))` (the forward's array outputs by name, logits in torch's layout), `to_canonical(tree,
    group)` (its gradient or parameter tree -> {canonical name: numpy array or summary}),
    `_activations` (inputs -> a common.capture.activations.Capture, named like the NNX twin's
    modules) and `new_record`. The model's mutable state besides its parameters (dropout RNG counts,
    running statistics) goes through the jitted step as an argument and comes back updated (a
    Variable closed over would be mutated inside a trace: "Cannot mutate RngCount from a different
    trace level"). The step-0 outputs come from the loss's own forward: one program gives them and
    the gradients (a forward of its own compiled a program more)."""

    state = None  # mutable non-parameter state threaded through the step
    eval_forward = ""  # how the eval-mode forward ran when not jitted (eval_logits)
    # step-0 activations are taken before the first update, from the start weights
    captures_after_run = False

    def bind(self, spec, options: RunOptions, monitor: CompileMonitor, mesh) -> None:
        """The run this trainer serves: its spec, options, compile monitor, mesh and data."""
        self.spec, self.options, self.monitor, self.mesh = spec, options, monitor, mesh
        self.provocations = list(options.provocations)
        self.data = make_dataset(spec)

    # ---- common's dropout masks (train.dropout_masks=common): a runtime defines
    # `fed_dropout(feed)`, the context in which its model's dropout takes the feed's masks, and
    # `mask_array` (a JAX array as that dropout takes it). The step's masks are step inputs
    # (`StepBatch.masks`), drawn for the dropout calls an abstract trace of the step recorded (one
    # trace per input shape).

    mask_array = staticmethod(lambda array: array)

    def fed_dropout(self, feed: MaskFeed):
        raise NotImplementedError

    def _fed(self, masks):
        return (
            self.fed_dropout(given_feed(masks, self.mask_array))
            if masks
            else contextlib.nullcontext()
        )

    def _fed_loss_and_aux(self, params, state, batch: StepBatch):
        with self._fed(batch.masks):
            return self._loss_and_aux(params, state, batch)

    def masks_for(self, batch: Batch, step: int) -> tuple:
        """Common's masks of `step` for `batch` when the spec asks for them, else none."""
        if self.spec.train.dropout_masks != MaskSource.COMMON:
            return ()
        key = str(jax.tree.map(lambda a: (a.shape, str(a.dtype)), batch.inputs))
        if key not in self._sites:
            with self.fed_dropout(MaskFeed()) as feed:  # records the calls; nothing is computed
                jax.eval_shape(self._loss_and_aux, self.params, self.state, StepBatch(*batch))
            self._sites[key] = feed.sites
        return draw_masks(self.spec.train.mask_seed, step, self._sites[key])

    @property
    def dropout_sites(self) -> list:
        """Step 0's dropout calls (the first input shape's), when fed common's masks."""
        return next(iter(self._sites.values()), [])

    def capture_masks(self):
        """The context of the step-0 activation capture: common's masks of step 0 (drawn afresh),
        when asked for."""
        if self.spec.train.dropout_masks != MaskSource.COMMON:
            return contextlib.nullcontext()
        return self.fed_dropout(
            drawing_feed(
                self.spec.train.mask_seed, 0, lambda mask: self.mask_array(jax.numpy.asarray(mask))
            )
        )

    def compile_functions(self, mesh) -> None:
        # Optimizer moments are placed like their parameters (sharded under fsdp/tp), counters
        # replicated; committed from the start, so step 1 does not recompile.
        param_placement = jax.tree.map(lambda x: x.sharding, self.params)
        opt_placement = optax.tree_utils.tree_map_params(
            self.tx,
            lambda _, s: s,
            jax.eval_shape(self.tx.init, self.params),
            param_placement,
            transform_non_params=lambda _: sharding.replicated(mesh),
        )
        self.opt_state = jax.jit(self.tx.init, out_shardings=opt_placement)(self.params)
        state_placement = jax.tree.map(lambda _: sharding.replicated(mesh), self.state)
        # committed as the step returns it
        self.state = jax.tree.map(sharding.place, self.state, state_placement)
        self.train_step = jax.jit(
            self._train_step,
            donate_argnums=(0, 1),
            static_argnames=("python_value",),
            out_shardings=(
                param_placement,
                opt_placement,
                state_placement,
                sharding.replicated(mesh),
            ),
        )
        self.loss_and_grads = jax.jit(jax.value_and_grad(self._fed_loss_and_aux, has_aux=True))
        self._sites = {}  # (input shape, dtype) -> the step's dropout calls (common's masks only)

    def _train_step(
        self, params, opt_state, state, batch: StepBatch, python_value: float | None = None
    ):
        def loss_fn(p, b):
            # the outputs: dead code to XLA
            loss, (new_state, _) = self._fed_loss_and_aux(p, state, b)
            return with_python_value(loss, python_value), new_state

        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = self.tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, state, loss

    def step(self, batch: StepBatch, python_value: float | None = None):
        self.params, self.opt_state, self.state, loss = self.train_step(
            self.params, self.opt_state, self.state, batch, python_value=python_value
        )
        return loss

    def on_device(self, tree: dict, group: str) -> bool:
        """Whether a tree of `group` is best converted on the devices: a tensor of it kept as a
        summary, or one no process holds whole (a multi-process run)."""
        mode, whole = self.options.tensors, set(self.options.whole_tensors)
        return any(
            summarized(f"{group}/{k}", v.size, mode, whole) or not v.is_fully_addressable
            for k, v in tree.items()
        )

    def kept(self, canonical: dict, group: str) -> dict:
        """{canonical name: device array} as the tensor file keeps it: a tensor of a parity group
        (`group`) kept as a summary (--tensors summary) summarized on the devices
        (jax_impl/summary.py), else whole: on the host, or this process's shards of it in a
        multi-process run (sharding.whole). Analysis: no compile of it is the run's."""
        mode, whole = self.options.tensors, set(self.options.whole_tensors)
        with self.monitor.analysis():
            return {
                k: device_summary(f"{group}/{k}", v)
                if summarized(f"{group}/{k}", v.size, mode, whole)
                else sharding.whole(v)
                for k, v in canonical.items()
            }

    def canonical_params(self) -> dict[str, np.ndarray]:
        return self.to_canonical(self.params, "params")

    def canonical_state(self) -> dict[str, np.ndarray]:
        """BatchNorm's running statistics by canonical name (`<module>.mean`, `.var`); {} without
        any."""
        return {}

    def trained_buffers(self) -> tuple[dict, list[str]]:
        """The model's other buffers or Variables after training, by the side's own names, as the
        tensor file keeps them (torch_impl/convert.py canonical_buffers), and the names of those
        that training changed (each side's convert.py changed_buffers); ({}, []) without any. The
        twin of every torch runtime's."""
        return {}, []

    def _eval_forward(self, params, state, inputs):
        """The model's eval-mode forward (dropout off, BatchNorm on its running statistics in
        `state`)."""
        raise NotImplementedError

    def eval_logits(self, inputs: np.ndarray) -> np.ndarray:
        """The trained model's eval-mode logits of `inputs` (a held batch's slice, replicated). A
        forward that branches on values in eval mode cannot be traced (transformers' causal mask,
        under torchax, builds a packed-sequence mask from the position ids and tests them): it runs
        op by op then, said in `eval_forward`, which the record keeps."""
        try:
            return sharding.to_host(jax.jit(self._eval_forward)(self.params, self.state, inputs))
        except UNTRACEABLE as e:
            self.eval_forward = (
                f"op by op: the eval-mode forward cannot be traced ({type(e).__name__})"
            )
            return sharding.to_host(
                self._eval_forward(self.params, self.state, jax.tree.map(jax.numpy.asarray, inputs))
            )

    def trace_step(self) -> None:
        """The loss and gradients of step 0's batch traced, as the jitted step traces them, and not
        compiled (an op check's: what the trace meets, or what it cannot trace, is raised here)."""
        self.loss_and_grads.trace(self.params, self.state, self.put(0))

    def step0_tensors(self) -> dict[str, dict[str, np.ndarray]]:
        """Parity tensors before any update: logits, every other array output and the loss of step
        0's batch, and every gradient (canonical)."""
        # {"logits": ..., every other array output by name}; the run's state stays as it is
        (loss, (_, outputs)), grads = self.loss_and_grads(self.params, self.state, self.put(0))
        return {
            "outputs": {
                **{k: sharding.to_host(v) for k, v in outputs.items()},
                "loss": np.asarray(sharding.to_host(loss)),
            },
            "grads": self.to_canonical(grads, "grads"),
        }

    # ---- driver.harness.Runtime ----

    def put(self, step: int) -> StepBatch:
        """The batch of `step` on the mesh (provoked when asked), with common's masks when the spec
        asks."""
        batch = provoked_batch(self.data.global_batch(step), step, self.provocations, np.int16)
        return sharding.put_batch(batch, self.spec.mesh, self.mesh, self.masks_for(batch, step))

    def batches(self, first: int, n: int):
        return (self.put(step) for step in range(first, first + n))

    def value_at(self, step: int) -> float | None:
        """The python-value provocation's number at `step` (common.provoke), None when not
        provoked."""
        return python_value(step, self.provocations, self.spec.train.steps)

    def timed_step(self, step: int, batch: StepBatch) -> tuple[float, float]:
        """One instrumented loop step: (loss on the host, synced wall ms). The benchmark times this
        too."""
        value = self.value_at(step)
        self.monitor.at(Phase.LOOP, step)
        start = time.perf_counter()
        loss = self.step(batch, value)
        loss.block_until_ready()  # one executable: when the loss is ready, so are the new params
        wall_ms = (time.perf_counter() - start) * 1e3
        return sharding.scalar_to_host(loss), wall_ms

    def step0_activations(self, inputs, targets) -> Capture:
        """Analysis, not training: its compiles are not counted (nor are the HLO statistics').
        `_activations` runs its forward in `capture_masks()`."""
        with self.monitor.analysis():
            return self._activations(inputs, targets)

    def after_loop(self, record: RunRecord, tensors: dict) -> None:
        steps = self.spec.train.steps
        self.monitor.at(Phase.LOOP, steps)
        if record.status != RecordStatus.OK:
            return
        if self.options.parity:
            tensors["params"], tensors["state"] = self.canonical_params(), self.canonical_state()
            tensors["buffers"], record.extra.buffers_changed = self.trained_buffers()
            with self.monitor.analysis():  # the eval forward's compile is not the run's
                tensors["eval"] = {"logits": self.eval_logits(held_inputs(self.spec, self.data))}
            if self.eval_forward:
                record.extra.eval_forward = self.eval_forward
        record.throughput = _pipelined_throughput(
            self, self.options.throughput_steps, self.value_at(steps)
        )
        record.profile = _profiled_steps(
            self,
            steps + record.throughput.get("steps", 0),
            self.options.profile_steps,
            self.value_at(steps),
            self.options.out_dir,
        )

    def analyse(self, record: RunRecord, tensors: dict) -> None:
        if record.status == RecordStatus.OK and self.options.hlo:
            with self.monitor.analysis():  # the analysis compile below is not part of training
                record.hlo_stats = hlo_statistics(
                    self.train_step,
                    (self.params, self.opt_state, self.state, self.put(0)),
                    self.options.out_dir / "train_step.hlo.txt",
                    python_value=self.value_at(0),
                )
        record.compile_events, record.recompile_causes = (
            list(self.monitor.events),
            list(self.monitor.causes),
        )


def _pipelined_throughput(trainer: JittedTrainer, steps: int | None, value: float | None) -> dict:
    """K more steps dispatched back to back, one wait at the end (state is discarded after)."""
    spec = trainer.spec
    steps = pipelined_steps(spec, steps)
    if steps <= 0:
        return {}
    # data ready on device before the clock
    batches = list(trainer.batches(spec.train.steps, steps))
    jax.block_until_ready(batches)
    start = time.perf_counter()
    for batch in batches:
        loss = trainer.step(batch, value)
    loss.block_until_ready()
    return throughput_summary(spec, steps, time.perf_counter() - start)


def _profiled_steps(
    trainer: JittedTrainer, first: int, n: int, value: float | None, out_dir: Path
) -> dict | None:
    """`--profile N`: N more steps under jax.profiler, annotated as common.vocab.ProfileRange says;
    the XProf trace goes to <run>/profile. Each step is timed by our clock too, as the loop times
    it, and so are N steps just before without the profiler (the machine's speed drifts between loop
    and profile)."""
    if n <= 0:
        return None
    unprofiled = []
    for step in range(first, first + n):
        batch = jax.block_until_ready(trainer.put(step))
        start = time.perf_counter()
        trainer.step(batch, value).block_until_ready()
        unprofiled.append((time.perf_counter() - start) * 1e3)
    first += n
    step_ms = []
    options = jax.profiler.ProfileOptions()
    # JAX traces every Python call by default: measured to slow a step by up to 1.6x
    options.python_tracer_level = 0
    options.host_tracer_level = 1
    jax.profiler.start_trace(str(out_dir / PROFILE_DIR), profiler_options=options)
    try:
        for step in range(first, first + n):
            with jax.profiler.TraceAnnotation(ProfileRange.INPUT):
                batch = jax.block_until_ready(trainer.put(step))
            with jax.profiler.StepTraceAnnotation(ProfileRange.STEP, step_num=step):
                start = time.perf_counter()
                with jax.profiler.TraceAnnotation(ProfileRange.CALL):
                    loss = trainer.step(batch, value)
                with jax.profiler.TraceAnnotation(ProfileRange.WAIT):
                    loss.block_until_ready()
                step_ms.append((time.perf_counter() - start) * 1e3)
    finally:
        jax.profiler.stop_trace()
    return {
        "steps": n,
        "dir": PROFILE_DIR,
        "tool": f"jax.profiler (jax {jax.__version__})",
        "step_ms": step_ms,
        "unprofiled_step_ms": unprofiled,
    }

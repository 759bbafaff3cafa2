"""The train loop of every runtime that trains through one jitted JAX step: the JAX twin and torchax.

Plain JAX (never flax): a runtime's trainer derives from `JittedTrainer` and
hands `run_jitted` how to build it on the mesh and its record; the optimizer
placement, the jitted step, the loop, the timing, the pipelined throughput and
the HLO statistics are the same for all of them.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import optax

from common.data import Batch, activation_inputs, held_inputs, make_dataset
from common.masks import MaskFeed, draw_masks, drawing_feed, given_feed, record_sites
from common.provoke import Provocation, provoked_batch, python_value, with_python_value
from common.record import RunRecord, peak_rss_mb, throughput_summary
from common.spec import RunSpec
from common.vocab import PROFILE_DIR, MaskSource, Phase, ProfileRange, RecordStatus
from jax_impl import sharding
from jax_impl.instrument import CompileMonitor, hlo_statistics
from jax_impl.sharding import StepBatch

# a trace that meets a value-dependent branch or conversion (the subclasses of ConcretizationTypeError among them)
UNTRACEABLE = (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError,
               jax.errors.TracerArrayConversionError)


class JittedTrainer:
    """What every one-jitted-step trainer shares: optimizer state placed like its parameters, the jitted
    step with donation, forward and loss-and-grads, and the step-0 parity tensors. A runtime sets
    `spec`, `params` (placed on `mesh`), `tx` and `start` (common.weights.start_info), calls
    `compile_functions(mesh)`, and defines `_forward`, `_loss`, `to_canonical` (its gradient or parameter
    tree -> {canonical name: numpy array}) and `step0_activations` (inputs -> a common.activations.Capture,
    named like the NNX twin's modules). A runtime whose model holds mutable state besides its parameters (the
    NNX twin's dropout RNG counts) sets `state` and defines `_loss_and_state`: the state goes through the
    jitted step as an argument and comes back updated (a Variable closed over would be mutated inside a
    trace: "Cannot mutate RngCount from a different trace level")."""

    state = None  # mutable non-parameter state threaded through the step; None when there is none
    eval_forward = ""  # how the eval-mode forward ran when not jitted (eval_logits)

    def _loss_and_state(self, params, state, batch: StepBatch):
        return self._loss(params, batch), state

    # ---- common's dropout masks (train.dropout_masks=common): a runtime defines `fed_dropout(feed)`, the
    # context in which its model's dropout takes the feed's masks, and `mask_array` (a JAX array as that
    # dropout takes it). The step's masks are step inputs (`StepBatch.masks`), drawn for the dropout calls an
    # abstract trace of the step recorded (one trace per input shape).

    mask_array = staticmethod(lambda array: array)

    def fed_dropout(self, feed: MaskFeed):
        raise NotImplementedError

    def _fed(self, masks):
        return self.fed_dropout(given_feed(masks, self.mask_array)) if masks else contextlib.nullcontext()

    def _fed_loss_and_state(self, params, state, batch: StepBatch):
        with self._fed(batch.masks):
            return self._loss_and_state(params, state, batch)

    def _fed_forward(self, params, batch: StepBatch):
        with self._fed(batch.masks):
            return self._forward(params, batch.inputs)

    def masks_for(self, batch: Batch, step: int) -> tuple:
        """Common's masks of `step` for `batch` when the spec asks for them, else none."""
        if self.spec.train.dropout_masks != MaskSource.COMMON:
            return ()
        key = (batch.inputs.shape, str(batch.inputs.dtype))
        if key not in self._sites:
            with self.fed_dropout(MaskFeed()) as feed:  # records the calls; nothing is computed
                jax.eval_shape(self._loss_and_state, self.params, self.state, StepBatch(*batch))
            self._sites[key] = feed.sites
        return draw_masks(self.spec.train.mask_seed, step, self._sites[key])

    @property
    def dropout_sites(self) -> list:
        """Step 0's dropout calls (the first input shape's), when fed common's masks."""
        return next(iter(self._sites.values()), [])

    def capture_masks(self):
        """The context of the step-0 activation capture (eager): common's masks of step 0, when asked for."""
        if self.spec.train.dropout_masks != MaskSource.COMMON:
            return contextlib.nullcontext()
        return self.fed_dropout(drawing_feed(self.spec.train.mask_seed, 0,
                                             lambda mask: self.mask_array(jax.numpy.asarray(mask))))

    def compile_functions(self, mesh) -> None:
        # Optimizer moments are placed like their parameters (sharded under fsdp/tp), counters
        # replicated; committed from the start, so step 1 does not recompile.
        param_placement = jax.tree.map(lambda x: x.sharding, self.params)
        opt_placement = optax.tree_utils.tree_map_params(
            self.tx, lambda _, s: s, jax.eval_shape(self.tx.init, self.params), param_placement,
            transform_non_params=lambda _: sharding.replicated(mesh))
        self.opt_state = jax.jit(self.tx.init, out_shardings=opt_placement)(self.params)
        state_placement = jax.tree.map(lambda _: sharding.replicated(mesh), self.state)
        self.state = jax.device_put(self.state, state_placement)  # committed as the step returns it: no recompile
        self.train_step = jax.jit(self._train_step, donate_argnums=(0, 1), static_argnames=("python_value",),
                                  out_shardings=(param_placement, opt_placement, state_placement,
                                                 sharding.replicated(mesh)))
        self.forward = jax.jit(self._fed_forward)
        self.loss_and_grads = jax.jit(jax.value_and_grad(self._fed_loss_and_state, has_aux=True))
        self._sites = {}  # (input shape, dtype) -> the step's dropout calls (common's masks only)

    def _train_step(self, params, opt_state, state, batch: StepBatch, python_value: float | None = None):
        def loss_fn(p, b):
            loss, new_state = self._fed_loss_and_state(p, state, b)
            return with_python_value(loss, python_value), new_state

        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = self.tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, state, loss

    def step(self, batch: StepBatch, python_value: float | None = None):
        self.params, self.opt_state, self.state, loss = self.train_step(
            self.params, self.opt_state, self.state, batch, python_value=python_value)
        return loss

    def canonical_params(self) -> dict[str, np.ndarray]:
        return self.to_canonical(self.params)

    def canonical_state(self) -> dict[str, np.ndarray]:
        """BatchNorm's running statistics by canonical name (`<module>.mean`, `.var`); {} without any."""
        return {}

    def _eval_forward(self, params, state, inputs):
        """The model's eval-mode forward (dropout off, BatchNorm on its running statistics in `state`)."""
        raise NotImplementedError

    def eval_logits(self, inputs: np.ndarray) -> np.ndarray:
        """The trained model's eval-mode logits of `inputs` (a held batch's slice, replicated). A forward that
        branches on values in eval mode cannot be traced (transformers' causal mask, under torchax, builds a
        packed-sequence mask from the position ids and tests them): it runs op by op then, said in
        `eval_forward`, which the record keeps."""
        try:
            return sharding.to_host(jax.jit(self._eval_forward)(self.params, self.state, inputs))
        except UNTRACEABLE as e:
            self.eval_forward = f"op by op: the eval-mode forward cannot be traced ({type(e).__name__})"
            return sharding.to_host(self._eval_forward(self.params, self.state, jax.numpy.asarray(inputs)))

    def step0_tensors(self, batch: StepBatch) -> dict[str, dict[str, np.ndarray]]:
        """Parity tensors before any update: logits and loss of `batch`, and every gradient (canonical)."""
        logits = self.forward(self.params, batch)
        (loss, _), grads = self.loss_and_grads(self.params, self.state, batch)  # the run's state stays as it is
        return {"outputs": {"logits": sharding.to_host(logits), "loss": np.asarray(sharding.to_host(loss))},
                "grads": self.to_canonical(grads)}


def timed_step(trainer, monitor: CompileMonitor, step: int, batch: StepBatch,
               value: float | None = None) -> tuple[float, float]:
    """One instrumented loop step: (loss on the host, synced wall ms). The benchmark times this same function.
    `value`: the python-value provocation's number (common.provoke), None when not provoked."""
    monitor.at(Phase.LOOP, step)
    start = time.perf_counter()
    loss = trainer.step(batch, value)
    loss.block_until_ready()  # one executable: when the loss is ready, so are the new params
    wall_ms = (time.perf_counter() - start) * 1e3
    return sharding.scalar_to_host(loss), wall_ms


def run_jitted(spec: RunSpec, out_dir: Path, make_trainer: Callable, new_record: Callable[[], RunRecord], *,
               parity: bool, activations: bool, throughput_steps: int | None, provocations: list[Provocation],
               monitor: CompileMonitor, progress=None, profile_steps: int = 0,
               hlo: bool = True) -> tuple[RunRecord, dict]:
    """Train `spec`; returns its record and the parity tensors (the caller writes both)."""
    timeline = {"ready": time.time()}  # epoch seconds: compare places them against the process launch
    if spec.train.matmul_precision != "default":
        jax.config.update("jax_default_matmul_precision", spec.train.matmul_precision)
    mesh = sharding.make_mesh(spec.mesh)
    data = make_dataset(spec)
    trainer = make_trainer(mesh)
    def put(step: int) -> StepBatch:
        batch = provoked_batch(data.global_batch(step), step, provocations, np.int16)
        return sharding.put_batch(batch, spec.mesh, mesh, trainer.masks_for(batch, step))

    tensors = trainer.step0_tensors(put(0)) if parity else {}  # before any update
    capture = None
    if activations:  # analysis, not training: its eager per-op compiles are not counted (as the HLO statistics')
        monitor.paused = True
        with trainer.capture_masks():
            capture = trainer.step0_activations(activation_inputs(spec, data.global_batch(0).inputs))
        tensors["activations"] = capture.arrays
        monitor.paused = False

    record = new_record()
    if capture is not None:
        record.extra["activations_skipped"] = capture.skipped
    record.extra["start"] = trainer.start
    record.extra["provoked"] = [str(p) for p in provocations]
    timeline["loop_start"] = time.time()
    for step in range(spec.train.steps):
        number = python_value(step, provocations, spec.train.steps)
        value, wall_ms = timed_step(trainer, monitor, step, put(step), number)
        if progress:
            progress(step, value, wall_ms)
        if not record.add_step(step, value, wall_ms):
            break
    monitor.at(Phase.LOOP, spec.train.steps)

    if record.status == RecordStatus.OK:
        if parity:
            tensors["params"], tensors["state"] = trainer.canonical_params(), trainer.canonical_state()
            monitor.paused = True  # analysis: the eval forward's compile is not the run's
            tensors["eval"] = {"logits": trainer.eval_logits(held_inputs(spec, data))}
            if trainer.eval_forward:
                record.extra["eval_forward"] = trainer.eval_forward
            monitor.paused = False
        last = python_value(spec.train.steps, provocations, spec.train.steps)
        record.throughput = _pipelined_throughput(trainer, spec, put, throughput_steps, last)
        record.profile = _profiled_steps(trainer, put, spec.train.steps + record.throughput.get("steps", 0),
                                         profile_steps, last, out_dir)
    timeline["loop_end"] = time.time()
    if record.status == RecordStatus.OK and hlo:
        monitor.paused = True  # the analysis compile below is not part of training
        record.hlo_stats = hlo_statistics(trainer.train_step, (trainer.params, trainer.opt_state, trainer.state,
                                                               put(0)),
                                          out_dir / "train_step.hlo.txt",
                                          python_value=python_value(0, provocations, spec.train.steps))
        monitor.paused = False
    record.compile_events, record.recompile_causes = list(monitor.events), list(monitor.causes)
    record_sites(record, spec, trainer.dropout_sites)
    record.timeline, record.peak_rss_mb = timeline, peak_rss_mb()
    return record, tensors


def _pipelined_throughput(trainer, spec: RunSpec, put, steps: int | None, value: float | None) -> dict:
    """K more steps dispatched back to back, one wait at the end (state is discarded after)."""
    steps = spec.train.steps if steps is None else steps
    if steps <= 0:
        return {}
    batches = [put(spec.train.steps + i) for i in range(steps)]  # data ready on device before the clock
    jax.block_until_ready(batches)
    start = time.perf_counter()
    for batch in batches:
        loss = trainer.step(batch, value)
    loss.block_until_ready()
    return throughput_summary(spec, steps, time.perf_counter() - start)


def _profiled_steps(trainer, put, first: int, n: int, value: float | None, out_dir: Path) -> dict | None:
    """`--profile N`: N more steps under jax.profiler, annotated as common.vocab.ProfileRange says; the
    XProf trace goes to <run>/profile. Each step is timed by our clock too, as the loop times it, and so
    are N steps just before without the profiler (the machine's speed drifts between loop and profile)."""
    if n <= 0:
        return None
    unprofiled = []
    for step in range(first, first + n):
        batch = jax.block_until_ready(put(step))
        start = time.perf_counter()
        trainer.step(batch, value).block_until_ready()
        unprofiled.append((time.perf_counter() - start) * 1e3)
    first += n
    step_ms = []
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # JAX traces every Python call by default: measured to slow a step by up to 1.6x
    options.host_tracer_level = 1
    jax.profiler.start_trace(str(out_dir / PROFILE_DIR), profiler_options=options)
    try:
        for step in range(first, first + n):
            with jax.profiler.TraceAnnotation(ProfileRange.INPUT):
                batch = jax.block_until_ready(put(step))
            with jax.profiler.StepTraceAnnotation(ProfileRange.STEP, step_num=step):
                start = time.perf_counter()
                with jax.profiler.TraceAnnotation(ProfileRange.CALL):
                    loss = trainer.step(batch, value)
                with jax.profiler.TraceAnnotation(ProfileRange.WAIT):
                    loss.block_until_ready()
                step_ms.append((time.perf_counter() - start) * 1e3)
    finally:
        jax.profiler.stop_trace()
    return {"steps": n, "dir": PROFILE_DIR, "tool": f"jax.profiler (jax {jax.__version__})", "step_ms": step_ms,
            "unprofiled_step_ms": unprofiled}

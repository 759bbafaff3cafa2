"""The PyTorch/XLA train loop as its users write it.

Model on `torch_xla.device()`; a `DataLoader` over `common.data` wrapped in `MpDeviceLoader` (which
moves batches to the device in background threads, and under SPMD shards them); forward, backward,
`clip_grad_norm_`, `xm.optimizer_step(optimizer)` (all-reduces gradients across replicas, then
steps), and `torch_xla.sync()` (the 2.9 name of `xm.mark_step()`), which cuts the lazily traced
graph and runs it. The learning rate of each step is set on the param groups from `TrainSpec.lr_at`,
as nanoGPT does; the optimizer's state is made before step 0.

Timing: a step's clock starts when its batch is on the device and stops after `torch_xla.sync()` and
`xm.wait_device_ops()`; the tracing part (Python building the graph, until the sync) is recorded
apart.

Trace modes (`--trace-mode`, recorded in the run record): `lazy` (default, the classic loop above:
every step is traced op by op, then `torch_xla.sync()`); `compile` (the step runs inside
`torch_xla.compile(full_graph=True)`, which syncs on exit and fails if the step would run a graph
early); `dynamo` (forward and loss under `torch.compile(backend="openxla")`: dynamo replays the
compiled forward/backward graphs instead of re-tracing them; clip and optimizer stay lazy, as in
torch_xla's Dynamo training recipe. Compiling the optimizer step too recompiles at every step:
dynamo guards on the float lr).

bf16: float32 parameters and optimizer state, forward under `torch.autocast("xla",
dtype=torch.bfloat16)`, float32 loss.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time

import numpy as np
import torch
import torch_xla
import torch_xla.backends
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.runtime as xr

from common.capture.activations import Capture, torch_output_layout
from common.data import held_inputs, make_dataset
from common.files.record import (
    RunExtra,
    RunRecord,
    dtype_counts,
    host_platform,
    numerics_env,
    package_versions,
    pipelined_steps,
    precision_numerics,
    throughput_summary,
)
from common.provoke import python_value, with_python_value
from common.spec import RunSpec
from common.twin import twin_of
from common.twin.outputs import array_outputs, forward, loss_batch
from common.vocab import Phase, RecordStatus, TraceMode
from common.weights.carried import start_info, start_state
from driver.harness import RunOptions
from torch_impl import convert
from torch_impl.capture import capture_activations, probed_or_forward_alone
from torch_impl.checkpoint_io import start_weights
from torch_impl.generate import generate_torch, host_logits
from torch_impl.islands import fresh_model_islands
from torch_impl.masks import step_masks
from torch_impl.models import as_fed, build_model
from torch_impl.optim import clip_gradients, create_state, make_optimizer, set_lr
from torch_impl.train import eval_logits, task_loss, untouched_buffers
from torch_impl.widen import widen_if_asked
from torch_xla_impl import replicas as replica_sync
from torch_xla_impl import sharding
from torch_xla_impl.batches import StepBatches, flat_ndims, nested, on_device
from torch_xla_impl.instrument import (
    COMPILE_COUNTERS,
    NoMonitor,
    attach_causes,
    dump_dir,
    hlo_statistics,
    step_graphs,
)
from torch_xla_impl.profiled import profiled_steps

# one step graph from step 0 on: the optimizer state exists before it (create_state)
SETTLE_STEPS = 1


class TorchXlaTrainer:
    """Model, optimizer and device loaders for one spec on this process's XLA device
    (driver.harness.Runtime). `mode`: single, spmd (one process over every device, `spmd_mesh`) or
    spawn (xmp.spawn, one replica of `replicas` per device); the trace mode is the options' own
    `trace_mode`."""

    dropout_sites = ()  # step 0's dropout calls, when fed common's masks
    # from a fresh copy of the start weights, after the run: its graphs are not the run's
    captures_after_run = True

    def __init__(
        self,
        spec: RunSpec,
        options: RunOptions | None = None,
        monitor=None,
        *,
        spmd_mesh=None,
        mode: str = "single",
        replica: int = 0,
        replicas: int = 1,
    ):
        self.options = options = options or RunOptions()
        trace_mode = TraceMode(getattr(options.own, "trace_mode", TraceMode.LAZY))
        self.spec, self.mesh, self.trace_mode, self.mode = spec, spmd_mesh, trace_mode, mode
        self.monitor, self.replica, self.replicas = monitor or NoMonitor(), replica, replicas
        checkpoint = options.checkpoint
        # per loop step: its tracing ms, and its batch's (shape, dtype)
        self.trace_ms, self.fed = [], []
        self.device = torch_xla.device()
        model = build_model(spec.model, spec.train.seed, spec.train.param_dtype)
        # the checkpoint's read and conversion, not the model's construction
        started = time.perf_counter()
        # (parameters, StartState)
        self.started = start_weights(model, spec, checkpoint), start_state(checkpoint)
        convert.load_start(model, *self.started, spec.model)
        # what training may change
        self.start_buffers = convert.canonical_buffers(convert.held_buffers(model))
        self.module_names = convert.modules_to_canonical(model, spec.model)
        self.start = start_info(checkpoint, time.perf_counter() - started)
        self.correspondence = convert.correspondence(model, spec.model)
        self.which = twin_of(spec.model).logits  # which of the forward's outputs is the logits
        self.loss_fn, self.user_loss = task_loss(spec), bool(twin_of(spec.model).loss)
        self.model = convert.moved(model, self.device)
        if spmd_mesh is not None:
            sharding.shard_model(self.model, spec.model, spec.mesh, spmd_mesh)
        self.optimizer = make_optimizer(self.model.parameters(), spec.train)
        # step 0 then traces the same graph as every later step: one compile
        create_state(self.optimizer)
        torch_xla.sync()
        self.monitor.collect()  # the state's zeros: a setup graph
        self.data = make_dataset(spec)
        # the device generator dropout draws from
        xm.set_rng_state(spec.train.mask_seed, device=self.device)
        self.provocations = list(options.provocations)
        self.autocast = (
            (lambda: torch.autocast("xla", dtype=torch.bfloat16))
            if spec.train.dtype == "bfloat16" and not spec.train.loads_bfloat16
            else contextlib.nullcontext
        )
        self.input_sharding = (
            None
            if spmd_mesh is None
            else sharding.input_sharding(
                spec.mesh, spmd_mesh, flat_ndims(self.data.global_batch(0))
            )
        )
        self.train_loss = (
            torch.compile(self._train_loss, backend="openxla")
            if trace_mode == TraceMode.DYNAMO
            else self._train_loss
        )

    def loader(self, first_step: int, n_steps: int):
        """This replica's batches of n_steps steps on the device, through MpDeviceLoader, as the
        loader carries them: `nested` (in the step, so that its view ops trace into the step's graph
        wherever the batch came from: nested as they are fetched, a batch's 1-D reshape ran alone at
        the loader's next sync, and the pipelined steps, whose batches are fetched first, compiled a
        third program; measured on the UNet)."""
        batches = StepBatches(
            self.data, first_step, n_steps, self.replica, self.replicas, self.provocations
        )
        return self._device_batches(batches)

    def global_device_batch(self, step: int) -> dict[str, torch.Tensor]:
        """The whole global batch of a step on this device (step-0 parity tensors, any mode),
        nested."""
        return nested(
            next(
                self._device_batches(
                    StepBatches(self.data, step, 1, provocations=self.provocations)
                )
            )
        )

    def _device_batches(self, batches: StepBatches):
        cpu_loader = torch.utils.data.DataLoader(
            batches, batch_size=None, shuffle=False, num_workers=0
        )
        return batches.checked(
            pl.MpDeviceLoader(cpu_loader, self.device, input_sharding=self.input_sharding)
        )

    def loss(self, batch) -> torch.Tensor:
        """Loss and array outputs (common.twin.outputs.array_outputs) of step 0's batch."""
        with self.autocast(), step_masks(self.spec, 0, self.device):
            outputs = forward(self.model, as_fed(batch["inputs"], self.spec.train))
        loss = self.loss_fn(outputs, self.loss_batch(batch["inputs"], batch["targets"]))
        return loss, array_outputs(outputs, self.which)

    def loss_batch(self, inputs, targets) -> dict:
        """The batch a loss is given; a classifier's targets (B,) as the task makes them (the
        loader's are (B, 1))."""
        if self.user_loss and self.spec.task == "classification":
            targets = targets.reshape(-1)
        return loss_batch(inputs, targets)

    def _train_loss(self, inputs, targets) -> torch.Tensor:
        with self.autocast():
            outputs = forward(self.model, as_fed(inputs, self.spec.train))
            return self.loss_fn(outputs, self.loss_batch(inputs, targets))

    def step(self, step: int, batch) -> torch.Tensor:
        """One train step of a loader batch; returns the (global) loss. In `lazy` and `dynamo` mode
        nothing runs until `sync()`; in `compile` mode the step runs on leaving
        `torch_xla.compile`."""
        set_lr(self.optimizer, self.spec.train, step)
        batch = nested(batch)
        if self.trace_mode == TraceMode.COMPILE:
            with torch_xla.compile(full_graph=True, name="train_step"):
                return self._update(step, batch)
        return self._update(step, batch)

    def _update(self, step: int, batch) -> torch.Tensor:
        # common's masks, uploaded as the step traces
        with step_masks(self.spec, step, self.device) as feed:
            loss = self.train_loss(batch["inputs"], batch["targets"])
        if step == 0 and feed:  # the run record's extra.dropout_sites: step 0's dropout calls
            self.dropout_sites = feed.sites
        loss = with_python_value(loss, python_value(step, self.provocations, self.spec.train.steps))
        loss.backward()
        if self.replicas > 1:
            # Replicas: average the gradients (and the loss) first, clip the averaged
            # gradients, then a plain step.
            loss = self._all_reduce(loss)
            self._clip()
            self.optimizer.step()
        else:
            self._clip()
            xm.optimizer_step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)  # gradients are no graph outputs
        return loss

    def wait(self) -> None:
        """Wait for this replica's device only: the default (every local device) makes one xmp.spawn
        thread hold the others' devices while it waits, which deadlocks the all-reduce (seen on
        CPU)."""
        xm.wait_device_ops(devices=xm.xla_real_devices([self.device]) if self.replicas > 1 else [])

    def sync(self, step: int) -> None:
        """Cut the traced graph and run it (xmp.spawn threads on CPU first meet while compiling)."""
        if self.trace_mode == TraceMode.COMPILE:
            return  # torch_xla.compile already ran the step
        if self.replicas > 1 and replica_sync.cpu_threads():
            replica_sync.sync_step(self, step, SETTLE_STEPS)
        else:
            torch_xla.sync()

    def _clip(self) -> None:
        clip_gradients(self.model.parameters(), self.spec.train)

    def _all_reduce(self, loss):
        if replica_sync.cpu_threads():
            return replica_sync.bucketed_all_reduce(
                list(self.model.parameters()), loss, self.replicas
            )
        xm.reduce_gradients(self.optimizer)
        return xm.all_reduce(xm.REDUCE_SUM, loss.detach(), scale=1.0 / self.replicas)

    def canonical_params(self) -> dict[str, np.ndarray]:
        return convert.to_canonical(self.model.state_dict(), self.correspondence)

    def canonical_state(self) -> dict[str, np.ndarray]:
        return convert.canonical_state(dict(self.model.named_buffers()), self.module_names)

    def trained_buffers(self) -> tuple[dict, list[str]]:
        # the twin of jax_impl/loop.py's
        kept = convert.canonical_buffers(convert.held_buffers(self.model))
        return kept, convert.changed_buffers(self.start_buffers, kept)

    def step0_tensors(self) -> dict[str, dict[str, np.ndarray]]:
        """Parity tensors before any update: logits and loss of step 0's global batch, and every
        gradient (canonical); replica 0's only."""
        if self.replica != 0:
            return {}
        batch = self.global_device_batch(0)
        # an analysis step: BatchNorm's statistics stay the run's
        with untouched_buffers(self.model):
            loss, outputs = self.loss(batch)
            loss.backward()  # (before the statistics are put back: its graph holds them)
        torch_xla.sync()
        grads = {name: p.grad for name, p in self.model.named_parameters()}
        out = {
            "outputs": {
                **{k: convert.host_float(v) for k, v in outputs.items()},
                "loss": np.asarray(loss.item()),
            },
            "grads": convert.to_canonical(grads, self.correspondence),
        }
        self.optimizer.zero_grad(set_to_none=True)
        self.monitor.collect()
        return out

    def step0_activations(self, inputs: np.ndarray, targets: np.ndarray) -> Capture:
        """Every module's input and output on `inputs` (step 0's batch, torch_impl.capture), from a
        fresh copy of the model at the start weights: after the run, whose graphs, compiles and HLO
        dump it must not join. Replica 0's."""
        if self.replica != 0:
            return Capture()

        def capture(probed: bool) -> Capture:
            model = self.start_model()
            with self.autocast(), step_masks(self.spec, 0, self.device):
                x = as_fed(on_device(inputs, self.device), self.spec.train)
                y = on_device(targets, self.device)
                loss_of = (lambda out: self.loss_fn(out, self.loss_batch(x, y))) if probed else None
                return capture_activations(
                    model,
                    x,
                    self.module_names,
                    sync=torch_xla.sync,
                    loss_of=loss_of,
                    output_layout=torch_output_layout(twin_of(self.spec.model).nnx_output_axes),
                )

        captured = probed_or_forward_alone(capture)  # its own graphs' dump is not the run's
        shutil.rmtree(dump_dir(self.options.out_dir), ignore_errors=True)
        return captured

    def start_model(self) -> torch.nn.Module:
        """A fresh copy of the model at the start weights on the device: an analysis after the run
        (a capture, a decode path) joins none of its graphs."""
        model = build_model(self.spec.model, self.spec.train.seed, self.spec.train.param_dtype)
        return convert.moved(convert.load_start(model, *self.started, self.spec.model), self.device)

    def generate(self, tokens, mask, n_new: int, forced=None, capture_at=None) -> dict:
        """The torch model's decode path on a fresh copy of the start weights, with a Hugging Face
        model's StaticCache (fixed shapes: the decode step compiles once), and the graphs compiled
        by each call counted."""
        model = self.start_model()
        static = getattr(self.options.own, "decode_cache", "static") == "static"
        self.decode_how = "lazy tensors, synced once a call, " + (
            "a StaticCache (fixed shapes)" if static else "a DynamicCache (growing shapes)"
        )

        def to_numpy(t: torch.Tensor) -> np.ndarray:
            # the whole step, its cache updates too: left pending, each step's graph would carry
            # every earlier one's (a new graph a token)
            torch_xla.sync()
            return host_logits(t)

        with self.autocast():
            return generate_torch(
                self.spec,
                model,
                self.device,
                tokens,
                mask,
                n_new,
                forced,
                to_numpy,
                static=static,
                compiles=lambda: sum(self.monitor.counters().get(k, 0) for k in COMPILE_COUNTERS),
            )

    def host_state(self) -> dict[str, torch.Tensor]:
        """Parameters and buffers (BatchNorm's running statistics) on the host, as they are now."""
        return {name: t.detach().cpu().clone() for name, t in self.model.state_dict().items()}

    def eval_logits(self, state: dict[str, torch.Tensor], inputs: np.ndarray) -> np.ndarray:
        """The eval-mode logits of `inputs` from a fresh copy of the model holding `state`
        (host_state): it runs after the run, whose graphs, compile events and HLO dump it must not
        join."""
        model = build_model(self.spec.model, self.spec.train.seed, self.spec.train.param_dtype)
        model.load_state_dict(state)
        return eval_logits(
            convert.moved(model, self.device),
            as_fed(on_device(inputs, self.device), self.spec.train),
            self.which,
            self.autocast,
            torch_xla.sync,
        )

    # ---- driver.harness.Runtime (step0_tensors, step0_activations above) ----

    def batches(self, first: int, n: int):
        return self.loader(first, n)

    def timed_step(self, step: int, batch) -> tuple[float, float]:
        """One instrumented loop step: (loss on the host, synced wall ms); its tracing ms go to
        `trace_ms`. The benchmark times this too."""
        self.monitor.at(Phase.LOOP, step)
        start = time.perf_counter()
        loss = self.step(step, batch)
        traced = time.perf_counter()
        self.sync(step)
        self.wait()
        wall_ms = (time.perf_counter() - start) * 1e3
        self.monitor.collect()
        self.trace_ms.append((traced - start) * 1e3)
        inputs = nested(batch)["inputs"]
        first = next(iter(inputs.values())) if isinstance(inputs, dict) else inputs
        self.fed.append((tuple(first.shape), str(first.dtype).removeprefix("torch.")))
        return loss.item(), wall_ms

    def after_loop(self, record: RunRecord, tensors: dict) -> None:
        steps = self.spec.train.steps
        self.monitor.at(Phase.LOOP, steps)
        if self.mode == "spawn":
            replica_sync.check_replicas_agree(self, record)
        if record.status != RecordStatus.OK:
            return
        if self.options.parity and self.replica == 0:
            tensors["params"], tensors["state"] = self.canonical_params(), self.canonical_state()
            tensors["buffers"], record.extra.buffers_changed = self.trained_buffers()
            # its eval-mode forward runs last, apart from the run's graphs
            self.trained = self.host_state()
        record.throughput = _pipelined_throughput(self, self.options.throughput_steps)
        record.profile = profiled_steps(
            self,
            steps + record.throughput.get("steps", 0),
            self.options.profile_steps,
            self.options.out_dir,
        )
        self.monitor.collect()

    def analyse(self, record: RunRecord, tensors: dict) -> None:
        record.compile_events, record.trace_ms = list(self.monitor.events), self.trace_ms
        record.extra.counters = self.monitor.counters()
        if self.replica != 0:  # one reader of the shared debug log and HLO dump
            return
        out_dir = self.options.out_dir
        attach_causes(record, out_dir, self.fed)
        if self.options.hlo:
            record.hlo_stats = hlo_statistics(
                out_dir, step_graphs(record.compile_events, SETTLE_STEPS, self.trace_mode)
            )
        # analysis too, after the run's graphs
        if self.options.parity and record.status == RecordStatus.OK:
            tensors["eval"] = {
                "logits": self.eval_logits(self.trained, held_inputs(self.spec, self.data))
            }
            shutil.rmtree(dump_dir(out_dir), ignore_errors=True)

    # on a CPU copy: no graph of the run's device
    def float32_islands(self, inputs, targets) -> tuple[dict[str, str], dict[str, int]]:
        return fresh_model_islands(
            self.spec, self.started, inputs, targets, self.loss_fn, self.loss_batch
        )

    def new_record(self) -> RunRecord:
        spec, replicas = self.spec, self.replicas
        return RunRecord(
            backend="torch_xla",
            spec=spec.to_dict(),
            versions=package_versions("torch", "torch-xla"),
            platform={
                **host_platform(),
                "device_platform": xr.device_type(),
                "device_kind": xr.device_type(),
                "device_count": xr.global_runtime_device_count(),
                "process_count": xr.process_count(),
            },
            numerics={
                "dtype": spec.train.dtype,
                "matmul_precision": spec.train.matmul_precision,
                "torch_xla_mat_mul_precision": torch_xla.backends.get_mat_mul_precision(),
                **precision_numerics(
                    spec.train,
                    "float32 params and optimizer state, torch.autocast('xla', bfloat16) forward, "
                    "float32 loss",
                ),
                "grad_clip": "torch.nn.utils.clip_grad_norm_: min(1, max_norm / (norm + 1e-6))",
                "weight_decay_applies_to": spec.train.decay_applies_to,
                "env": numerics_env(),
            },
            settle_steps=SETTLE_STEPS,
            trace_mode=self.trace_mode,
            param_dtypes=dtype_counts(p.dtype for p in self.model.parameters()),
            extra=RunExtra(
                notes={
                    "mode": self.mode,
                    "replicas": replicas,
                    "compile_counts_cover": "every replica in this process"
                    if self.mode == "spawn"
                    else "this process",
                    "loader": "torch_xla.distributed.parallel_loader.MpDeviceLoader",
                    "step_api": _step_api(replicas),
                    "sync_api": "torch_xla.sync" if hasattr(torch_xla, "sync") else "xm.mark_step",
                    "mesh_strategy": spec.mesh.strategy,
                }
            ),
        )


def make_trainer(
    spec: RunSpec, options: RunOptions, monitor, *, mode: str, replica: int = 0, replicas: int = 1
) -> TorchXlaTrainer:
    """The run's trainer (driver.harness.run builds it after the process is ready): torch_xla's
    matmul precision from the spec, and the SPMD mesh when one process runs several devices."""
    widen_if_asked(spec)
    logging.getLogger("torch_xla.backends").setLevel(logging.ERROR)  # it warns on every call
    torch_xla.backends.set_mat_mul_precision(spec.train.matmul_precision)
    mesh = sharding.make_mesh(spec.mesh) if mode == "spmd" else None
    return TorchXlaTrainer(
        spec, options, monitor, spmd_mesh=mesh, mode=mode, replica=replica, replicas=replicas
    )


def _pipelined_throughput(trainer: TorchXlaTrainer, steps: int | None) -> dict:
    """K more steps with a sync each but one wait at the end (tracing overlaps device work).

    As in the JAX twin, the batches are on the device before the clock starts,
    so both twins time the same thing: steps, not data loading. The loss stays
    referenced until the sync, as in the loop: a loss dropped before
    `torch_xla.sync()` is no graph output, so torch_xla traces and compiles a
    different graph (measured: one extra compile).
    """
    spec = trainer.spec
    steps = pipelined_steps(spec, steps)
    if steps <= 0:
        return {}
    batches = list(trainer.loader(spec.train.steps, steps))
    trainer.wait()
    start = time.perf_counter()
    for i, batch in enumerate(batches):
        loss = trainer.step(spec.train.steps + i, batch)  # noqa: F841  (kept alive until the sync)
        trainer.sync(spec.train.steps + i)
    trainer.wait()
    return throughput_summary(spec, steps, time.perf_counter() - start)


def _step_api(replicas: int) -> str:
    if replicas == 1:
        return "xm.optimizer_step"
    if replica_sync.cpu_threads():
        return "bucketed all-reduce with a channel id (_xla_spmd_all_reduce) + optimizer.step"
    return "xm.reduce_gradients + optimizer.step"

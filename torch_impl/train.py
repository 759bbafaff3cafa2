"""Torch training: the pieces every torch runtime shares (the loss, the eval-mode forward, buffers
kept out of analysis steps: the twins of `jax_impl/train.py`'s; the optimizer is
torch_impl/optim.py's), and the eager PyTorch runtime itself (`TorchTrainer`), which the `torch`
backend runs and every port is checked against."""

from __future__ import annotations

import contextlib
import copy
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from common.capture.activations import Capture, torch_output_layout
from common.capture.decisions import read_decisions
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
from common.provoke import provoked_batch, python_value, with_python_value
from common.spec import RunSpec
from common.twin import twin_of, user_loss
from common.twin.outputs import array_outputs, forward, logits_of, loss_batch
from common.vocab import RecordStatus
from common.weights.carried import start_info, start_state
from driver.harness import RunOptions
from torch_impl import summary
from torch_impl.capture import capture_activations, probed_or_forward_alone
from torch_impl.checkpoint_io import start_weights
from torch_impl.convert import (
    canonical_buffers,
    canonical_state,
    changed_buffers,
    correspondence,
    held_buffers,
    host_float,
    load_start,
    modules_to_canonical,
)
from torch_impl.distributed import (
    Group,
    average_gradients,
    gather_rows,
    local_rows,
    mean_value,
    refuse_batch_norm,
)
from torch_impl.generate import generate_torch
from torch_impl.islands import float32_islands
from torch_impl.masks import step_masks
from torch_impl.models import as_fed, at_least_float32, build_model
from torch_impl.optim import clip_gradients, make_optimizer, set_lr
from torch_impl.widen import widen_if_asked


def cross_entropy(logits, targets):
    """Mean softmax cross-entropy over every position, in float32 (float64 in a float64 run)."""
    return F.cross_entropy(
        at_least_float32(logits).reshape(-1, logits.shape[-1]), targets.reshape(-1).long()
    )


def torch_ints(array: np.ndarray) -> np.ndarray:
    """A twin's named integer arrays as int64, torch's index dtype (embedding ids, a loss's
    labels)."""
    return array.astype(np.int64) if array.dtype.kind in "iu" else array


def mean_squared_error(predictions, targets):
    """Mean squared error over every element, in float32 (float64 in a float64 run)."""
    predictions = at_least_float32(predictions)
    return F.mse_loss(predictions, targets.to(predictions.dtype).reshape(predictions.shape))


def task_loss(spec: RunSpec):
    """`loss(outputs, batch) -> scalar` of the run, on the forward's whole output and batch =
    {"inputs": ..., "targets": ...}: the twin's own torch loss, or the task's (cross-entropy or mean
    squared error of the output the twin's `logits` picks); every torch runtime trains on it (the
    twin of jax_impl.train.task_loss)."""
    twin = twin_of(spec.model)
    if twin.loss:
        loss = user_loss(twin, "torch")
        return lambda outputs, batch: at_least_float32(loss(outputs, batch))
    built_in = mean_squared_error if spec.task == "regression" else cross_entropy
    return lambda outputs, batch: built_in(logits_of(outputs, twin.logits), batch["targets"])


# ---- The eager PyTorch runtime (`python -m torch_impl`): the ground truth of the PyTorch side ----

# eager PyTorch compiles nothing: every step is the same Python running the same kernels
SETTLE_STEPS = 0
BF16_POLICY = "float32 params and optimizer state, torch.autocast(bfloat16) forward, float32 loss"
# torch's own default: highest
MATMUL_PRECISION = {"highest": "highest", "high": "high", "default": "highest"}


def device_for_this_machine() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def wait(device: torch.device) -> None:
    """The host waits for the device (CUDA runs asynchronously; the CPU already has)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TorchTrainer:
    """Model, optimizer and batches of one spec, eagerly, on this machine's device
    (driver.harness.Runtime)."""

    dropout_sites = ()  # step 0's dropout calls, when fed common's masks
    step0_flops = None  # counted by the parity step (step0_tensors), when it runs
    # step-0 activations are taken before the first update, from the start weights
    captures_after_run = False

    def __init__(
        self,
        spec: RunSpec,
        options: RunOptions | None = None,
        device: torch.device | None = None,
        group: Group | None = None,
    ):
        options = options or RunOptions()
        self.spec, self.options, self.device = spec, options, device or device_for_this_machine()
        # one of several processes, data parallel (torch_impl/distributed.py); None: alone
        self.group = group
        self.provocations, checkpoint = list(options.provocations), options.checkpoint
        model = build_model(spec.model, spec.train.seed, spec.train.param_dtype)
        # the checkpoint's read and conversion, not the model's construction
        started = time.perf_counter()
        self.model = load_start(
            model, start_weights(model, spec, checkpoint), start_state(checkpoint), spec.model
        )
        self.module_names = modules_to_canonical(self.model, spec.model)
        self.start_buffers = canonical_buffers(held_buffers(self.model))  # what training may change
        self.model = self.model.to(self.device)
        if group is not None:
            refuse_batch_norm(self.model, group.size)
        self.start = start_info(checkpoint, time.perf_counter() - started)
        self.correspondence = correspondence(self.model, spec.model)
        self.which = twin_of(spec.model).logits  # which of the forward's outputs is the logits
        self.loss_fn = task_loss(spec)
        self.optimizer = make_optimizer(self.model.parameters(), spec.train)
        self.data = make_dataset(spec)
        # dropout draws from here on: each share of the rows its own masks, as one process draws
        # different masks for different rows (the ranks of one tensor group the same)
        torch.manual_seed(spec.train.mask_seed + (group.share if group else 0))
        self.autocast = (
            (lambda: torch.autocast(self.device.type, dtype=torch.bfloat16))
            if spec.train.dtype == "bfloat16" and not spec.train.loads_bfloat16
            else contextlib.nullcontext
        )

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        batch = local_rows(
            provoked_batch(self.data.global_batch(step), step, self.provocations, np.int64),
            self.group,
        )
        return self.to_device(batch.inputs, fed=True), self.to_device(batch.targets)

    def to_device(self, part, fed: bool = False):
        """An array, or a twin's named arrays, as tensors on this runtime's device; what the forward
        is `fed` in the dtype it takes (models.as_fed)."""
        # named arrays: integers as torch's index dtype, as a torch data loader gives
        if isinstance(part, dict):
            tensors = {k: self.to_device(torch_ints(v)) for k, v in part.items()}
        else:
            tensors = torch.from_numpy(np.ascontiguousarray(part)).to(self.device)
        return as_fed(tensors, self.spec.train) if fed else tensors

    def loss(self, inputs, targets) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss and array outputs (common.twin.outputs.array_outputs) of step 0's batch."""
        with self.autocast(), self.masks(0):
            outputs = forward(self.model, inputs)
        return self.loss_fn(outputs, loss_batch(inputs, targets)), array_outputs(
            outputs, self.which
        )

    def masks(self, step: int):
        """The dropout of `step`: common's masks when the spec asks for them (torch_impl.masks)."""
        return step_masks(self.spec, step, self.device)

    def step(self, step: int, inputs, targets) -> torch.Tensor:
        set_lr(self.optimizer, self.spec.train, step)
        self.optimizer.zero_grad(set_to_none=True)
        # the logits are not kept: freed once the loss is computed
        with self.autocast(), self.masks(step) as feed:
            loss = self.loss_fn(forward(self.model, inputs), loss_batch(inputs, targets))
        if step == 0 and feed:  # the run record's extra.dropout_sites: step 0's dropout calls
            self.dropout_sites = feed.sites
        loss = with_python_value(loss, python_value(step, self.provocations, self.spec.train.steps))
        loss.backward()
        average_gradients(self.model.parameters(), self.group)
        clip_gradients(self.model.parameters(), self.spec.train)
        self.optimizer.step()
        return loss

    def step0_tensors(self) -> dict[str, dict[str, np.ndarray]]:
        """Parity tensors before any update: logits and loss of step 0's batch, and every gradient
        (canonical)."""
        inputs, targets = self.batch(0)
        # an analysis step: BatchNorm's statistics stay the run's; its matmul and convolution flops
        # counted, the forward + backward of every step's (the record's flops_per_step)
        with untouched_buffers(self.model), FlopCounterMode(display=False) as counter:
            loss, outputs = self.loss(inputs, targets)
            loss.backward()  # (before the statistics are put back: its graph holds them)
        self.step0_flops = float(counter.get_total_flops())
        average_gradients(self.model.parameters(), self.group)
        grads = {name: p.grad for name, p in self.model.named_parameters()}
        out = {
            "outputs": {
                **{k: gather_rows(host_float(v), self.group) for k, v in outputs.items()},
                "loss": np.asarray(mean_value(loss, self.group).item()),
            },
            "grads": self.kept(grads, "grads"),
        }
        self.optimizer.zero_grad(set_to_none=True)
        return out

    def step0_activations(self, inputs: np.ndarray, targets: np.ndarray) -> Capture:
        """Every module's input and output on `inputs` (a slice of step 0's batch;
        torch_impl.capture), and the gradient of the loss on `targets` at each."""
        inputs, targets = self.to_device(inputs, fed=True), self.to_device(targets)

        def capture(probed: bool) -> Capture:
            with self.autocast(), self.masks(0), untouched_buffers(self.model):
                return capture_activations(
                    self.model,
                    inputs,
                    self.module_names,
                    loss_of=(lambda out: self.loss_fn(out, loss_batch(inputs, targets)))
                    if probed
                    else None,
                    output_layout=torch_output_layout(twin_of(self.spec.model).nnx_output_axes),
                    impose=read_decisions(self.options.impose_decisions)
                    if self.options.impose_decisions
                    else None,
                )

        return probed_or_forward_alone(capture)

    def eval_logits(self, inputs: np.ndarray) -> np.ndarray:
        """The trained model's eval-mode logits of `inputs` (dropout off, BatchNorm on its running
        statistics)."""
        return eval_logits(self.model, self.to_device(inputs, fed=True), self.which, self.autocast)

    def generate(self, tokens, mask, n_new: int, forced=None, capture_at=None) -> dict:
        """The torch model's decode path on the start weights (common/generation.py)."""
        self.decode_how = "eager"
        with self.autocast():
            return generate_torch(
                self.spec,
                self.model,
                self.device,
                tokens,
                mask,
                n_new,
                forced,
                capture_at=capture_at,
            )

    def canonical_params(self) -> dict[str, np.ndarray]:
        return self.kept(self.model.state_dict(), "params")

    def kept(self, tensors: dict, group: str) -> dict:
        """{canonical name: host array or summary} of a parity group as the tensor file keeps it
        (summaries made on the model's device: torch_impl/summary.py)."""
        return summary.kept(
            tensors,
            self.correspondence,
            group,
            self.options.tensors,
            frozenset(self.options.whole_tensors),
        )

    def canonical_state(self) -> dict[str, np.ndarray]:
        return canonical_state(dict(self.model.named_buffers()), self.module_names)

    def trained_buffers(self) -> tuple[dict, list[str]]:
        """The buffers after training as the tensor file keeps them, and those training changed (the
        twin of jax_impl/loop.py's)."""
        kept = canonical_buffers(held_buffers(self.model))
        return kept, changed_buffers(self.start_buffers, kept)

    # ---- driver.harness.Runtime (step0_tensors, step0_activations above) ----

    def batches(self, first: int, n: int):
        return (self.batch(step) for step in range(first, first + n))

    def timed_step(self, step: int, batch) -> tuple[float, float]:
        """One loop step: (loss on the host, synced wall ms). The benchmark times this too."""
        start = time.perf_counter()
        loss = self.step(step, *batch)
        value = mean_value(loss, self.group).item()  # waits for the device
        wait(self.device)
        return value, (time.perf_counter() - start) * 1e3

    def after_loop(self, record: RunRecord, tensors: dict) -> None:
        if record.status != RecordStatus.OK:
            return
        if self.options.parity:
            tensors["params"], tensors["state"] = self.canonical_params(), self.canonical_state()
            tensors["buffers"], record.extra.buffers_changed = self.trained_buffers()
            tensors["eval"] = {"logits": self.eval_logits(held_inputs(self.spec, self.data))}
        record.throughput = _pipelined_throughput(self, self.options.throughput_steps)

    def analyse(self, record: RunRecord, tensors: dict) -> None:
        if record.status == RecordStatus.OK:
            # of this process's rows, as HLO's per device
            record.flops_per_step = (
                self.step0_flops
                if self.step0_flops is not None
                else self.matmul_flops(*self.batch(0))
            )
            record.flops_source = (
                "torch.utils.flop_counter.FlopCounterMode over one forward + backward"
            )

    def float32_islands(self, inputs, targets) -> tuple[dict[str, str], dict[str, int]]:
        inputs, targets = self.to_device(inputs), self.to_device(targets)
        return float32_islands(
            self.model,
            inputs,
            self.module_names,
            lambda out: self.loss_fn(out, loss_batch(inputs, targets)),
        )

    def new_record(self) -> RunRecord:
        spec, device = self.spec, self.device
        kind = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        processes = self.group.size if self.group else 1
        strategy = spec.mesh.strategy
        if self.group and self.group.shares == processes:
            strategy = (
                f"data parallel over {processes} processes (torch.distributed, gloo), each a "
                f"whole replica on its share of the rows (the run's mesh, {spec.mesh.strategy}, "
                "is the compiling backends': eager torch splits no other axis)"
            )
        elif self.group:
            strategy = (
                f"the twin's per-rank code on {processes} processes (torch.distributed, gloo), one "
                f"rank per device of the mesh {spec.mesh.strategy}, the rows split "
                f"{self.group.shares} way(s)"
            )
        return RunRecord(
            backend="torch",
            spec=spec.to_dict(),
            versions=package_versions("torch"),
            platform={
                **host_platform(),
                "device_platform": device.type,
                "device_kind": kind,
                "device_count": processes,
                "process_count": processes,
            },
            numerics={
                "dtype": spec.train.dtype,
                "matmul_precision": spec.train.matmul_precision,
                "torch_float32_matmul_precision": torch.get_float32_matmul_precision(),
                **precision_numerics(spec.train, BF16_POLICY),
                "grad_clip": "torch.nn.utils.clip_grad_norm_: min(1, max_norm / (norm + 1e-6))",
                "weight_decay_applies_to": spec.train.decay_applies_to,
                "env": numerics_env(),
            },
            settle_steps=SETTLE_STEPS,
            param_dtypes=dtype_counts(p.dtype for p in self.model.parameters()),
            extra=RunExtra(
                notes={
                    "compiles": "none: eager PyTorch runs op by op and compiles nothing, so it "
                    "has no compile counts or "
                    "recompile causes",
                    "step_api": "loss.backward(), clip_grad_norm_, optimizer.step()",
                    "mesh_strategy": strategy,
                }
            ),
        )

    def matmul_flops(self, inputs, targets) -> float:
        """Matmul and convolution flops of one forward + backward, counted by torch
        (FlopCounterMode), on a copy: the count is of the step compare times, without touching the
        trained model."""
        model = copy.deepcopy(self.model)
        with FlopCounterMode(display=False) as counter:
            with self.autocast():
                loss = self.loss_fn(forward(model, inputs), loss_batch(inputs, targets))
            loss.backward()
        return float(counter.get_total_flops())


@contextlib.contextmanager
def untouched_buffers(model: torch.nn.Module):
    """Buffers as they were before the block: a forward the run does not train on (the parity step,
    the activation capture) must not move BatchNorm's running statistics, which the run's own steps
    move."""
    saved = {name: b.detach().clone() for name, b in model.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(saved[name])


def eval_logits(
    model: torch.nn.Module, inputs: torch.Tensor, which, autocast, sync=lambda: None
) -> np.ndarray:
    """`model`'s eval-mode logits (every torch runtime's; `which`: the twin's `logits`; `sync` cuts
    a lazy graph), the model left in train mode."""
    model.eval()
    try:
        with torch.no_grad(), autocast():
            logits = logits_of(forward(model, inputs), which)
        sync()
        return host_float(logits)
    finally:
        model.train()


def make_trainer(spec: RunSpec, options: RunOptions, group: Group | None = None) -> TorchTrainer:
    """The run's trainer (driver.harness.run builds it after the process is ready): torch's float32
    matmul precision from the spec first."""
    widen_if_asked(spec)
    precision = MATMUL_PRECISION[spec.train.matmul_precision]
    # (the call warns even when it changes nothing)
    if torch.get_float32_matmul_precision() != precision:
        torch.set_float32_matmul_precision(precision)
    return TorchTrainer(spec, options, group=group)


def _pipelined_throughput(trainer: TorchTrainer, steps: int | None) -> dict:
    """K more steps with one wait at the end (on the CPU every op already waits: equal to
    synced)."""
    spec = trainer.spec
    steps = pipelined_steps(spec, steps)
    if steps <= 0:
        return {}
    # on the device before the clock
    batches = [trainer.batch(spec.train.steps + i) for i in range(steps)]
    wait(trainer.device)
    start = time.perf_counter()
    for i, (inputs, targets) in enumerate(batches):
        trainer.step(spec.train.steps + i, inputs, targets)
    wait(trainer.device)
    return throughput_summary(spec, steps, time.perf_counter() - start)

"""python -m torch_impl.describe --spec SPEC --out DIR: a twin's torch side, before any training.

Writes `torch_params.json` ({parameter name: shape}, named_parameters order), `torch_modules.json`
({module holding parameters: its torch.nn type}, which decides a ConvTranspose's layout),
`torch_weights.json` (how each module uses its matrix, probed, and the tied names:
torch_impl/orientation.py) and
`torch_init.safetensors` (the factory's own initialisation, seeded by train.seed, or with `--load` a
torch or Hugging Face checkpoint, checked against the model; torch names and layouts), from which
compare derives the correspondence and both sides' common start. A factory that raises or returns
something else than an nn.Module, or a user twin whose forward returns no usable logits, is one line
and exit 2.
"""

from __future__ import annotations

from pathlib import Path

from common.cli import INPUT_ERRORS, Parser, fail
from common.data import make_dataset, rows
from common.data.batches import check_every_step, check_forward_keys
from common.files.fsutil import write_json_atomic
from common.presets import build_variants, load_spec
from common.procs import exit_process
from common.spec import RunSpec, SpecError, TwinSpec
from common.twin import TwinError, twin_of, user_decode, user_loss
from common.twin.outputs import NoOwnLoss, choose, forward, loss_batch, loss_refusal, refusal
from common.twin.start_state import TORCH_STATE
from common.vocab import ExitCode
from common.weights import save_checkpoint
from common.weights.checkpoints import TORCH_BUFFERS
from torch_impl.checkpoint_io import check_carried_buffers, load_torch_side
from torch_impl.orientation import tied_names, weight_orientations
from torch_impl.widen import widen_if_asked


def check_forward(model, spec: RunSpec) -> None:
    """A user twin's forward on step 0's first example (no gradients, eval mode) must return the
    logits: a tensor, or an output holding them (common/twin/outputs.py). A forward that raises is
    left to the run, which reports it the same on every backend."""
    import torch

    # every step's batch drawn and checked before anything trains, once (this side)
    if spec.task == "custom":
        check_every_step(spec)
        check_forward_keys(spec, model.forward, "torch")
    first = make_dataset(spec).global_batch(0)
    inputs, targets = (_tensors(rows(part, 0, 1)) for part in (first.inputs, first.targets))
    wide = spec.train.dtype == "float64"
    default = torch.get_default_dtype()
    if wide:  # the forward as the run computes it: a float64 copy, under the float64 default
        torch.set_default_dtype(torch.float64)
        widen_if_asked(spec)  # its casts to float32 as the run computes them (torch_impl/widen.py)
        model, inputs, targets = _widened(model), _widened(inputs), _widened(targets)
    try:
        _check_outputs(model, spec, inputs, targets)
        if wide:
            check_float64(model, inputs)
    finally:
        torch.set_default_dtype(default)


def _widened(value):
    """A float64 copy of a model, a tensor or a dict of tensors (integers as they are)."""
    import copy

    import torch

    if isinstance(value, torch.nn.Module):
        return copy.deepcopy(value).to(torch.float64)
    if isinstance(value, dict):
        return {k: _widened(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    return value


def _check_outputs(model, spec: RunSpec, inputs, targets) -> None:
    """The forward on step 0's first example returns the logits, and the twin's own loss a value it
    can train on."""
    import torch

    training = model.training
    try:
        with torch.no_grad():
            out = forward(model.eval(), inputs)
    except Exception:
        return
    finally:
        model.train(training)
    twin = twin_of(spec.model)
    if choose(out, twin.logits) is None:
        raise TwinError(
            f"twin {spec.model.twin!r}: the forward of torch={twin.torch!r} "
            f"{refusal(out, twin.logits)}"
        )
    if twin.loss:
        try:
            value = user_loss(twin, "torch")(out, loss_batch(inputs, targets))
        except NoOwnLoss as e:  # loss='model' and a forward that returned none
            value = e
        except Exception:  # a loss that raises is left to the run, as a forward that does
            value = None
        why = (
            f"the forward of torch={twin.torch!r} {value}"
            if isinstance(value, NoOwnLoss)
            else value is not None and loss_refusal(value, "torch", twin)
        )
        if why:
            raise TwinError(f"twin {spec.model.twin!r}: {why}")


def _tensors(part):
    import torch

    if part is None:
        return None
    return (
        {k: torch.from_numpy(v) for k, v in part.items()}
        if isinstance(part, dict)
        else torch.from_numpy(part)
    )


def check_float64(model, inputs) -> None:
    """A float64 run's torch side must compute in float64: the model in float64 (check_forward's
    copy, under torch's float64 default), on the example widened, refused naming its module where
    its code feeds float32 to a float64 layer (torch_impl/islands.py), before any backend trains."""
    from torch_impl.islands import float32_islands

    try:
        float32_islands(model, inputs, {name: name for name, _ in model.named_modules() if name})
    except SpecError:
        raise
    # any other failure of the forward is left to the run, which reports it on every backend
    except Exception:
        return


def start_state(model) -> dict:
    """Every buffer the model holds but its BatchNorms' running statistics (carried apart), as the
    factory built it (common/twin/start_state.py): what each torch runtime's record keeps of them
    after training."""
    from torch_impl.convert import canonical_buffers, held_buffers

    return canonical_buffers(held_buffers(model))


def module_kinds(model) -> dict[str, str]:
    """{module path: the torch.nn class it is or subclasses} of every module holding parameters of
    its own."""
    return {
        name: next(
            (c.__name__ for c in type(m).__mro__ if c.__module__.startswith("torch.nn.")),
            type(m).__name__,
        )
        for name, m in model.named_modules()
        if next(m.parameters(recurse=False), None) is not None
    }


def main(argv=None) -> int:
    parser = Parser(prog="python -m torch_impl.describe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--load", metavar="FORMAT:PATH", help="start from this torch or hf checkpoint instead"
    )
    parser.add_argument("--also-spec", action="append", default=[], metavar="BACKEND=PATH")
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        from torch_impl.models import build_model

        model = build_model(spec.model, spec.train.seed)
        user_decode(twin_of(spec.model), "torch")  # a declared decode path that is not one: refused
        shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
        build_variants(
            args.also_spec,
            lambda other: build_model(other.model, other.train.seed),
            "torch",
            lambda built: {name: tuple(p.shape) for name, p in built.named_parameters()},
            shapes,
        )
        buffer_shapes = {name: tuple(b.shape) for name, b in model.named_buffers()}
        params, buffers = (
            load_torch_side(args.load, spec, shapes, buffer_shapes)
            if args.load
            else (
                {name: p.detach().float().cpu().numpy() for name, p in model.named_parameters()},
                {},
            )
        )
        check_carried_buffers(model, buffers, f"checkpoint {args.load}")
        if isinstance(spec.model, TwinSpec) and shapes:
            check_forward(model, spec)
    except INPUT_ERRORS as e:
        fail(str(e), ExitCode.USAGE)
    write_json_atomic(
        args.out / "torch_params.json", {name: list(shape) for name, shape in shapes.items()}
    )
    write_json_atomic(args.out / "torch_modules.json", module_kinds(model))
    write_json_atomic(
        args.out / "torch_weights.json",
        {"orientations": weight_orientations(model), "ties": tied_names(model)},
    )
    save_checkpoint(args.out / "torch_init.safetensors", params)
    if isinstance(spec.model, TwinSpec):
        save_checkpoint(args.out / TORCH_STATE, start_state(model))
    if buffers:  # a full state_dict's buffers (BatchNorm's running statistics), in torch names
        save_checkpoint(args.out / TORCH_BUFFERS, buffers)
    return ExitCode.OK


if __name__ == "__main__":
    exit_process(main())

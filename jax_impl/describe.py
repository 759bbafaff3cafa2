"""python -m jax_impl.describe --spec SPEC --out DIR: a twin's NNX side, before any training.

Writes `nnx_params.json` ({canonical name: shape}: the `nnx.state(model, nnx.Param)` paths, which
are the canonical tree) and `nnx_modules.json` ({module holding parameters: its flax.nnx type},
which decides a ConvTranspose's layout). A factory that raises or returns something else than an
nnx.Module, a forward that returns more than one array (traced abstractly, nothing computed), or a
JAX_PLATFORMS this machine lacks is one line and exit 2.
"""

from __future__ import annotations

from pathlib import Path

from common.cli import INPUT_ERRORS, Parser, fail
from common.data import make_dataset, rows
from common.data.batches import check_forward_keys
from common.files.fsutil import write_json_atomic
from common.presets import build_variants, load_spec
from common.procs import exit_process
from common.spec import RunSpec
from common.twin import TwinError, twin_of, user_decode, user_loss
from common.twin.outputs import NoOwnLoss, choose, forward, loss_batch, loss_refusal, refusal
from common.twin.start_state import NNX_STATE, storable
from common.vocab import ExitCode
from common.weights import save_checkpoint
from driver.backend_main import first_words


def check_forward(model, spec: RunSpec) -> None:
    """The model's forward on step 0's first example must return the logits: an array, or an output
    holding them (common/twin/outputs.py). Traced abstractly (jax.eval_shape). A forward that raises
    is left to the run, which reports it the same on every backend, unless it runs on the example
    transposed channel-last: then the twin lacks its `nnx_input_axes`, refused here before any side
    trains."""
    from flax import nnx

    from jax_impl.models import nnx_input_axes, nnx_inputs

    axes = nnx_input_axes(spec)
    first = make_dataset(spec).global_batch(0)
    # a twin's regions split the batch's rows over the mesh's data x fsdp: as many as they need
    examples = spec.mesh.batch_replicas if twin_of(spec.model).nnx_mesh_arg else 1
    inputs = nnx_inputs(rows(first.inputs, 0, examples), axes)
    if spec.task == "custom":
        check_forward_keys(spec, model.__call__, "NNX")
    model.eval()
    graphdef, state = nnx.split(model)
    try:
        out = _traced(graphdef, state, inputs)
    except Exception as e:
        _refuse_channel_first(graphdef, state, inputs, axes, spec, e)
        _refuse_mesh(inputs, spec, e)
        return
    twin = twin_of(spec.model)
    if choose(out, twin.logits) is None:
        raise TwinError(
            f"twin {spec.model.twin!r}: the forward of nnx={twin.nnx!r} {refusal(out, twin.logits)}"
        )
    if twin.loss:
        _check_loss(
            graphdef,
            state,
            inputs,
            None if first.targets is None else rows(first.targets, 0, examples),
            spec,
        )


def _check_loss(graphdef, state, inputs, targets, spec: RunSpec) -> None:
    """The twin's own NNX loss on step 0's first example, traced abstractly: a float scalar (the
    torch side's describe step checks its own the same way); a loss that raises is the run's."""
    from flax import nnx

    twin = twin_of(spec.model)
    loss = user_loss(twin, "nnx")
    try:
        value = _abstract(
            lambda s, x, t: loss(forward(nnx.merge(graphdef, s), x), loss_batch(x, t)),
            state,
            inputs,
            targets,
        )
    except NoOwnLoss as e:
        raise TwinError(f"twin {spec.model.twin!r}: the forward of nnx={twin.nnx!r} {e}") from None
    except Exception:
        return
    why = loss_refusal(value, "nnx", twin)
    if why:
        raise TwinError(f"twin {spec.model.twin!r}: {why}")


def _traced(graphdef, state, inputs):
    from flax import nnx

    return _abstract(lambda s, x: forward(nnx.merge(graphdef, s), x), state, inputs)


def _abstract(function, state, *trees):
    """function(state, *trees) traced with shapes only (jax.eval_shape): no FLOP is spent."""
    import jax

    return jax.eval_shape(
        function,
        state,
        *(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), t) for t in trees),
    )


def _refuse_channel_first(graphdef, state, inputs, axes, spec: RunSpec, error: Exception) -> None:
    """An NNX forward that raised on channel-first images (no `nnx_input_axes`) but runs on them
    channel-last: an NHWC port fed NCHW. Refused with the declaration that fixes it; any other
    failure is the run's."""
    if axes or getattr(inputs, "ndim", 0) < 3:
        return
    channel_last = (0, *range(2, inputs.ndim), 1)
    try:
        _traced(graphdef, state, inputs.transpose(channel_last))
    except Exception:
        return
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    raise TwinError(
        f"twin {spec.model.twin!r}: the NNX forward raised on inputs of shape {list(inputs.shape)} "
        f"({type(error).__name__}: {first}) and runs on them channel-last: add "
        f"nnx_input_axes={channel_last} to the twin (an NHWC port of a channel-first model)"
    )


def shapes_of(params: dict) -> dict:
    return {name: tuple(v.shape) for name, v in params.items()}


def _refuse_mesh(inputs, spec: RunSpec, error: Exception) -> None:
    """A twin's NNX forward that raised on the run's mesh but runs with its regions on one device:
    the mesh is one its model's sizes do not divide (heads over "tensor", say). Refused naming the
    mesh, before any side trains; any other failure is the run's."""
    from flax import nnx

    from jax_impl import sharding
    from jax_impl.models import build_model

    twin = twin_of(spec.model)
    if not twin.nnx_mesh_arg or spec.mesh.device_count == 1:
        return
    with sharding.one_device_mesh():
        try:
            graphdef, state = nnx.split(build_model(spec.model, seed=spec.train.seed))
            _traced(graphdef, state, inputs)
        except Exception:
            return
    first = first_words(error) or type(error).__name__
    own = ",".join(f"{k}={v}" for k, v in twin.mesh.items()) or "one device"
    raise TwinError(
        f"twin {spec.model.twin!r}: its NNX forward does not run on the mesh "
        f"data={spec.mesh.data},fsdp={spec.mesh.fsdp},tensor={spec.mesh.tensor} and runs on one "
        f"device ({type(error).__name__}: {first}): the model's sizes do not split over it; give "
        f"a --mesh they divide (the twin's own: {own})"
    )


def start_state(model) -> dict:
    """Every Variable the model holds that is neither a Param, running statistics (carried apart)
    nor RNG state, as the factory built it (common/twin/start_state.py)."""
    from flax import nnx

    from jax_impl.convert import held_buffers

    return {name: storable(value) for name, value in held_buffers(nnx.state(model)).items()}


def module_kinds(model) -> dict[str, str]:
    """{module path: the flax.nnx class it is or subclasses} of every module holding parameters of
    its own; an nnx.ConvTranspose that keeps its kernel unflipped says so."""
    from flax import nnx

    out = {}
    for path, module in nnx.iter_modules(model):
        if not any(isinstance(v, nnx.Param) for v in vars(module).values()):
            continue
        kind = next(
            (c.__name__ for c in type(module).__mro__ if c.__module__.startswith("flax.nnx")),
            type(module).__name__,
        )
        if isinstance(module, nnx.ConvTranspose) and module.transpose_kernel:
            kind += "(transpose_kernel=True)"
        out[".".join(str(p) for p in path)] = kind
    return out


def main(argv=None) -> int:
    parser = Parser(prog="python -m jax_impl.describe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--also-spec", action="append", default=[], metavar="BACKEND=PATH")
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        from flax import nnx

        from jax_impl.convert import to_canonical
        from jax_impl.models import build_model
        from jax_impl.sharding import check_platform, make_mesh, set_cpu_device_count

        # as its run sets it, before JAX initialises: the run this
        set_cpu_device_count(spec.mesh.device_count)
        check_platform()  # process may go on to make (driver/describe_sides.py) cannot set it after
        if twin_of(spec.model).nnx_mesh_arg:  # its forward runs its regions on the run's mesh
            make_mesh(spec.mesh)
        model = build_model(spec.model, seed=spec.train.seed)
        user_decode(twin_of(spec.model), "nnx")  # a declared decode path that is not one: refused
        params = to_canonical(nnx.state(model, nnx.Param))
        build_variants(
            args.also_spec,
            lambda other: build_model(other.model, seed=other.train.seed),
            "NNX",
            lambda built: shapes_of(to_canonical(nnx.state(built, nnx.Param))),
            shapes_of(params),
        )
        kinds, state = module_kinds(model), start_state(model)
        if params:
            check_forward(model, spec)
    except INPUT_ERRORS as e:
        fail(str(e), ExitCode.USAGE)
    write_json_atomic(
        args.out / "nnx_params.json", {name: list(v.shape) for name, v in params.items()}
    )
    write_json_atomic(args.out / "nnx_modules.json", kinds)
    save_checkpoint(args.out / NNX_STATE, state)
    import jax

    # a run this process goes on to make (driver/describe_sides.py) compiles as a fresh one would
    jax.clear_caches()
    return ExitCode.OK


if __name__ == "__main__":
    exit_process(main())

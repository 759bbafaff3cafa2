"""The NNX side's decode path (common/generation.py): the twin's `decode["nnx"]` called on the
model as the run holds it, jitted as a JAX user serves it (the prefill, the decode step and the
whole sequence's prefill each one program), eagerly where it cannot be traced; and the training
forward beside it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from common.capture.activations import input_layout
from common.generation import generate
from common.twin import TwinError, twin_of, twin_words, user_decode
from common.twin.outputs import forward, logits_of
from jax_impl.capture import capture_activations
from jax_impl.loop import UNTRACEABLE


def host_logits(x) -> np.ndarray:
    """Logits on the host in float32 (bfloat16 widened exactly), float64 kept."""
    return np.asarray(x if x.dtype == jnp.float64 else x.astype(jnp.float32))


class NnxDecodePath:
    """The twin's decode function bound to a model: jitted over the model's state, or eager once a
    trace of it fails (a value-dependent branch, say); `how` says which ran."""

    def __init__(self, spec, model: nnx.Module):
        twin = twin_of(spec.model)
        if "nnx" not in twin.decode:
            raise TwinError(
                f"--generate: {twin_words(spec.model)} names no NNX decode path; give "
                "decode={'nnx': 'file.py:decode'} (docs/reference/twin.md)"
            )
        self.decode, self.twin = user_decode(twin, "nnx"), twin
        model.eval()
        self.model = model
        self.graphdef, self.state = nnx.split(model)

        def decode_step(state, *args):
            return self.decode(nnx.merge(self.graphdef, state), *args)

        self.jitted = jax.jit(decode_step)
        self.how = "jitted (jax.jit over the model's state)"

    def step(self, tokens, positions, mask, cache):
        args = (jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask), cache)
        if self.jitted is not None:
            try:
                return self.jitted(self.state, *args)
            except UNTRACEABLE as e:
                self.jitted = None
                self.how = f"eager: its decode function cannot be traced ({type(e).__name__})"
        return self.decode(self.model, *args)

    def capture(self, tokens, positions, mask, cache):
        """Every module's input and output in one call of the decode path (jax_impl/capture.py),
        from these arguments; the run's cache is not advanced (the call is pure)."""
        rest = (jnp.asarray(positions), jnp.asarray(mask), cache)
        return capture_activations(
            self.model,
            jnp.asarray(tokens),
            input_layout(self.twin.nnx_input_axes),
            call=lambda model, x: self.decode(model, x, *rest)[0],
        )

    def forward(self, tokens):
        """The training forward's logits, in the torch side's layout (nnx_output_axes)."""
        out = logits_of(forward(self.model, jnp.asarray(tokens)), self.twin.logits)
        axes = self.twin.nnx_output_axes
        return out.transpose(axes) if axes else out


# the jitted decode function's name in the compile events (CompileMonitor's fun_name)
DECODE_PROGRAM = "decode_step"


def generate_nnx(
    spec, model: nnx.Module, tokens, mask, n_new: int, forced, events: list, capture_at=None
) -> tuple[dict, str]:
    """common.generation.generate on the NNX side; (its arrays, how the decode path ran). `events`:
    the run's compile events, of which the decode program's are counted; `capture_at`: the step
    whose call is captured module by module."""
    path = NnxDecodePath(spec, model)
    compiles = lambda: sum(DECODE_PROGRAM in e.fun_name for e in events)  # noqa: E731
    out = generate(
        path.step,
        host_logits,
        tokens,
        mask,
        n_new,
        forced,
        path.forward,
        compiles,
        None if capture_at is None else (capture_at, path.capture),
    )
    return out, path.how

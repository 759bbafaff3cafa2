"""The NNX side's discrete choices at step 0 (common/capture/decisions.py): `jax.lax.top_k`,
`jnp.argmax`, `jnp.argmin`, `jnp.argsort` replaced while the capture's forward traces (restored
after), each call's choice and scores kept with the module it ran in. A port that bound one of them
under another name at import (`from jax.lax import top_k`) is not seen: then the sides' decisions
differ in number, and the report says they were not set side by side."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

from common.capture.decisions import Decision, oriented

PREFIX = "decision:"  # kept[PREFIX + "<i>:indices" | "<i>:scores"]


@contextlib.contextmanager
def watched_decisions(where, keep, facts: list):
    """For the block, each watched call runs as itself and `keep(key, value)`s its indices and
    scores, appending {module, op, dim, smallest} to `facts` (`where()`: the module it runs in)."""

    def record(op, scores, indices, dim, smallest):
        # a ranking of integers is exact: no rounding flips it
        if not jnp.issubdtype(scores.dtype, jnp.floating):
            return
        i = len(facts)
        facts.append({"module": where(), "op": op, "dim": dim, "smallest": smallest})
        keep(f"{PREFIX}{i}:indices", indices)
        keep(f"{PREFIX}{i}:scores", scores)

    top_k, argmax, argmin, argsort = jax.lax.top_k, jnp.argmax, jnp.argmin, jnp.argsort

    def watched_top_k(operand, k, *args, **kwargs):
        values, indices = top_k(operand, k, *args, **kwargs)
        record("topk", operand, indices, operand.ndim - 1, False)
        return values, indices

    def arg_of(op, original, smallest):
        def watched(a, axis=None, *args, **kwargs):
            indices = original(a, axis, *args, **kwargs)
            if axis is None:
                record(op, jnp.ravel(a), jnp.ravel(indices), 0, smallest)
            else:
                record(op, a, indices, axis % a.ndim, smallest)
            return indices

        return watched

    def watched_argsort(a, axis=-1, *args, **kwargs):
        indices = argsort(a, axis, *args, **kwargs)
        record("argsort", a, indices, axis % a.ndim, not kwargs.get("descending", False))
        return indices

    jax.lax.top_k, jnp.argsort = watched_top_k, watched_argsort
    jnp.argmax, jnp.argmin = arg_of("argmax", argmax, False), arg_of("argmin", argmin, True)
    try:
        yield
    finally:
        jax.lax.top_k, jnp.argmax, jnp.argmin, jnp.argsort = top_k, argmax, argmin, argsort


def decisions_of(kept: dict, facts: list) -> list[Decision]:
    """The kept arrays, on the host, as Decisions."""
    out = []
    for i, fact in enumerate(facts):
        indices, scores = oriented(
            kept[f"{PREFIX}{i}:indices"], kept[f"{PREFIX}{i}:scores"], fact["dim"], fact["smallest"]
        )
        out.append(Decision(fact["module"], fact["op"], indices, scores))
    return out
